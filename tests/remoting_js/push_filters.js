'use strict';
// Push consumption with a tag expression and with an SQL92 expression over the messages' properties, two groups
// of one process: each gets exactly what its expression selects.
const { args, Message, producer, consumer, summary, until, sleep, main } = require('./common');

const TAGS = [ 'TagA', 'TagB', 'TagC' ];

main(async () => {
  const p = await producer();
  for (let i = 0; i < args.count; i++) {
    const msg = new Message(args.topic, TAGS[i % TAGS.length], `body-${i}`);
    msg.properties.n = String(i);
    await p.send(msg);
  }
  const byTag = new Map();
  const bySql = new Map();
  const tagged = consumer(`${args.group}-tags`);
  tagged.subscribe(args.topic, 'TagA || TagB', async msg => {
    byTag.set(msg.body.toString(), summary(msg));
  });
  const selected = consumer(`${args.group}-sql`);
  selected.subscribe(args.topic, { expressionType: 'SQL92', subString: args.sql }, async msg => {
    bySql.set(msg.body.toString(), summary(msg));
  });
  await until(() => byTag.size >= args.expectTags && bySql.size >= args.expectSql, 'both groups\' messages', 20000);
  await sleep(500); // anything the filters should have kept back would come in this time too
  return { tags: Array.from(byTag.values()), sql: Array.from(bySql.values()) };
});
