'use strict';
// Sends through the name server's routes (the client spreads messages over every broker's queues), then a push
// consumer of a new group reads every acknowledged message back.
const { args, Message, producer, consumer, summary, sendSummary, until, main } = require('./common');

main(async () => {
  const p = await producer();
  const sent = [];
  for (let i = 0; i < args.count; i++) {
    const msg = new Message(args.topic, i % 2 ? 'TagOdd' : 'TagEven', `body-${i}`);
    msg.keys = [ `key-${i}` ];
    sent.push(Object.assign(sendSummary(await p.send(msg)), { body: `body-${i}` }));
  }
  const received = new Map();
  const c = consumer(args.group);
  c.subscribe(args.topic, '*', async msg => {
    received.set(msg.body.toString(), summary(msg));
  });
  await until(() => received.size >= sent.length, `${sent.length} messages back`, 20000);
  return { sent, received: Array.from(received.values()) };
});
