'use strict';
// A listener that fails each message once (ACTION_RETRY): the client sends it back (CONSUMER_SEND_MSG_BACK), the
// broker redelivers it through the group's %RETRY% topic, and the listener gets it again with reconsumeTimes 1.
const { args, Message, Consumer, producer, consumer, summary, until, main } = require('./common');

main(async () => {
  const p = await producer();
  for (let i = 0; i < args.count; i++) {
    await p.send(new Message(args.topic, 'TagR', `retry-${i}`));
  }
  const deliveries = [];
  const failed = new Set();
  const c = consumer(args.group);
  c.subscribe(args.topic, '*', async msg => {
    const body = msg.body.toString();
    deliveries.push(summary(msg));
    if (!failed.has(body)) {
      failed.add(body);
      return Consumer.ACTION_RETRY;
    }
  });
  await until(() => deliveries.length >= 2 * args.count, 'every message twice', 20000);
  return { deliveries };
});
