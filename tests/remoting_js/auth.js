'use strict';
// Under --auth: the client signs every request (AccessKey, Signature: HMAC-SHA1 over the sorted extension fields
// and the body). A writer's sends are stored, a reader's push consumer gets them; a user without rights, an
// unsigned client and a wrong secret are refused. Each identity is a client of its own (instanceName): ali-ons
// shares one connection set, and so one identity, per instance name in a process.
const { args, Message, Producer, Consumer, clientOptions, summary, until, main } = require('./common');

async function producerAs(name, creds) {
  const p = new Producer(clientOptions(Object.assign({ producerGroup: `js-auth-${name}`, instanceName: name }, creds)));
  p.on('error', () => {});
  await p.ready();
  return p;
}

// A send by the client's send call (which retries every queue and then throws without the broker's code), and the
// same send one level down, which keeps the broker's response code.
async function refusal(p, body) {
  const outcome = {};
  try {
    outcome.sent = (await p.send(new Message(args.topic, 'TagX', body))).sendStatus;
  } catch (err) {
    outcome.error = err.message;
  }
  const route = await p._mqClient.getTopicRouteInfoFromNameServer(args.topic, 3000);
  const brokerData = route.brokerDatas[0];
  const header = {
    producerGroup: p.producerGroup, topic: args.topic, defaultTopic: 'TBW102', defaultTopicQueueNums: 4, queueId: 0,
    sysFlag: 0, bornTimestamp: Date.now(), flag: 0, properties: '', reconsumeTimes: 0, unitMode: false,
  };
  try {
    await p._mqClient.sendMessage(brokerData.brokerAddrs['0'], brokerData.brokerName,
      new Message(args.topic, 'TagX', body), header, 3000);
    outcome.code = 0;
  } catch (err) {
    outcome.code = err.code;
  }
  return outcome;
}

main(async () => {
  const writer = await producerAs('writer', args.writer);
  const sent = [];
  for (let i = 0; i < args.count; i++) {
    try {
      sent.push((await writer.send(new Message(args.topic, 'TagS', `signed-${i}`))).sendStatus);
    } catch (err) {
      const probe = await refusal(writer, `probe-${i}`); // the broker's own code for the refusal
      throw new Error(`${err.message}; the broker answers the writer's signed send with code ${probe.code}`);
    }
  }
  const nobody = await refusal(await producerAs('nobody', args.nobody), 'from-nobody');
  const unsigned = await refusal(await producerAs('unsigned', { accessKey: '', secretKey: '' }), 'unsigned');
  const forged = await refusal(await producerAs('forged', { accessKey: args.writer.accessKey, secretKey: 'not-the-secret' }), 'forged');
  const received = new Map();
  const reader = new Consumer(clientOptions(Object.assign({
    consumerGroup: args.group, instanceName: 'reader', consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
  }, args.reader)));
  reader.on('error', err => console.error('reader:', err.message));
  reader.subscribe(args.topic, '*', async msg => {
    received.set(msg.body.toString(), summary(msg));
  });
  await until(() => received.size >= args.count, 'the reader\'s messages', 20000);
  return { sent, nobody, unsigned, forged, received: Array.from(received.values()) };
});
