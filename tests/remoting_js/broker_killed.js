'use strict';
// Sends one message at a time and reports each acknowledgement as a line, so that the test can kill a broker
// while they go on: the client's retries move the sends to the other broker.
const { args, Message, producer, sendSummary, emit, sleep, main } = require('./common');

main(async () => {
  const p = await producer();
  const acked = [];
  const failed = [];
  for (let i = 0; i < args.count; i++) {
    const body = `k-${i}`;
    try {
      const sent = Object.assign(sendSummary(await p.send(new Message(args.topic, 'TagK', body))), { body });
      acked.push(sent);
      emit({ acked: sent });
    } catch (err) {
      failed.push({ body, error: err.message });
      emit({ failed: body });
    }
    await sleep(args.pauseMs);
  }
  return { acked, failed };
});
