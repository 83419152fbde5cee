'use strict';
// Offsets by time: messages sent before and after a whole second; a consumer group starting at that second
// (CONSUME_FROM_TIMESTAMP, whose queue offsets the client looks up with SEARCH_OFFSET_BY_TIMESTAMP) gets only the
// later ones. The client's timestamps have whole seconds.
const utils = require('ali-ons/lib/utils');
const { args, Message, producer, consumer, summary, until, sleep, main } = require('./common');

main(async () => {
  const p = await producer();
  for (let i = 0; i < args.count; i++) {
    await p.send(new Message(args.topic, 'TagT', `before-${i}`));
  }
  const second = Math.ceil((Date.now() + 1) / 1000) * 1000;
  await sleep(second - Date.now() + 20);
  for (let i = 0; i < args.count; i++) {
    await p.send(new Message(args.topic, 'TagT', `after-${i}`));
  }
  const received = new Map();
  const c = consumer(args.group, {
    consumeFromWhere: 'CONSUME_FROM_TIMESTAMP', consumeTimestamp: utils.timeMillisToHumanString(second),
  });
  c.subscribe(args.topic, '*', async msg => {
    received.set(msg.body.toString(), summary(msg));
  });
  await until(() => received.size >= args.count, 'the later messages', 20000);
  await sleep(300); // an earlier message, if the offsets were wrong, would come in this time too
  return { second, received: Array.from(received.values()) };
});
