'use strict';
// A message by its id, as RocketMQ 4 clients look one up: the offset id names the storing broker's address and
// the commit-log offset; VIEW_MESSAGE_BY_ID (33) to that address gives the stored message, decoded here by the
// client's own message decoder. (ali-ons ships the decoder and the request code; its viewMessage is unexported.)
const ByteBuffer = require('byte');
const MessageDecoder = require('ali-ons/lib/message/message_decoder');
const RemotingCommand = require('ali-ons/lib/protocol/command/remoting_command');
const RequestCode = require('ali-ons/lib/protocol/request_code');
const { args, Message, producer, summary, sendSummary, main } = require('./common');

main(async () => {
  const p = await producer();
  const msg = new Message(args.topic, 'TagV', 'viewed-by-id');
  msg.keys = [ 'view-key' ];
  const sent = sendSummary(await p.send(msg));
  const id = MessageDecoder.decodeMessageId(sent.msgId);
  const request = RemotingCommand.createRequestCommand(RequestCode.VIEW_MESSAGE_BY_ID, { offset: id.offset.toString() });
  const looked = { sent, address: id.address, offset: id.offset.toString() };
  let response;
  try {
    response = await p._mqClient.invoke(id.address, request, 3000);
  } catch (err) {
    return Object.assign(looked, { error: err.message });
  }
  const found = response.code === 0 ? summary(MessageDecoder.decode(ByteBuffer.wrap(response.body))) : null;
  return Object.assign(looked, { code: response.code, remark: response.remark, found });
});
