'use strict';
// What every scenario shares: its argument (one JSON object in argv[2]: the name server's remoting address, the
// topic, the group, ...), ali-ons producers and consumers pointed at that name server, and the JSON lines a
// scenario writes on stdout for tests/unit/remoting/test_rocketmq4_js_client.py to read.
const { Producer, Consumer, Message } = require('ali-ons');

const args = JSON.parse(process.argv[2] || '{}');

// The client logs every route refresh at info level; warnings and errors go to stderr, which pytest shows when a
// scenario fails.
const logger = {
  info() {},
  debug() {},
  warn(...a) { console.error('warn:', ...a); },
  error(...a) { console.error('error:', ...a); },
};

// Short intervals: the client's defaults (30 s route polls and heartbeats, 10 s rebalances) would make each
// scenario wait that long before it sees a new topic or consumer.
function clientOptions(extra) {
  return Object.assign({
    // ali-ons asks for an HTTP client to look up Aliyun's name servers; with nameSrv given it is never called.
    httpclient: {},
    logger,
    nameSrv: args.namesrv,
    pollNameServerInteval: 500,
    heartbeatBrokerInterval: 1000,
    rebalanceInterval: 500,
    persistConsumerOffsetInterval: 300,
  }, extra);
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

async function producer(group) {
  const p = new Producer(clientOptions({ producerGroup: group || 'js-producer' }));
  p.on('error', err => logger.error(err));
  await p.ready();
  return p;
}

function consumer(group, extra) {
  const c = new Consumer(clientOptions(Object.assign({ consumerGroup: group, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET' }, extra)));
  c.on('error', err => logger.error(err.message));
  return c;
}

// A message's fields as the tests compare them.
function summary(msg) {
  return {
    msgId: msg.msgId, topic: msg.topic, tags: msg.tags || null, keys: msg.keys || null, queueId: msg.queueId,
    queueOffset: msg.queueOffset, body: msg.body.toString(), reconsumeTimes: msg.reconsumeTimes,
    properties: msg.properties, storeHost: msg.storeHost,
  };
}

function sendSummary(result) {
  return {
    msgId: result.msgId, sendStatus: result.sendStatus, brokerName: result.messageQueue.brokerName,
    queueId: Number(result.messageQueue.queueId), queueOffset: result.queueOffset,
  };
}

async function until(condition, what, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}`);
    }
    await new Promise(resolve => setTimeout(resolve, 20));
  }
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

// Runs a scenario, writes its result as the last line, and exits: the client's timers would keep the process alive.
function main(scenario) {
  scenario().then(result => {
    emit({ result });
    process.exit(0);
  }, err => {
    console.error(err && err.stack || err);
    emit({ error: String(err && err.message || err), code: err && err.code });
    process.exit(1);
  });
}

module.exports = { args, Message, Producer, Consumer, clientOptions, producer, consumer, summary, sendSummary, emit, until, sleep, main };
