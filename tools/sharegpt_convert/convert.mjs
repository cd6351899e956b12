// Converts ShareGPT conversations into kvtier's block-trace JSONL, the
// Mooncake form plus "session" and "turn" (docs/REPLAY.md, "ShareGPT").
//
//   node convert.mjs --in FILE.json --out FILE.jsonl [--block-tokens 512]
//       [--session-rate 0.5] [--think-s 20] [--seed 1]
//
// Tokenizer: llama3-tokenizer-js 1.2.0 (Llama 3's BPE), with Llama 3's chat
// template: <|begin_of_text|>, then per message <|start_header_id|>ROLE
// <|end_header_id|>\n\n CONTENT <|eot_id|>. Turn j's prompt is messages
// 1..(2j-1) followed by the assistant header (the generation prompt); its
// output is message 2j's content. Every message is tokenized on its own and
// the pieces concatenated, so each turn's prompt is a token prefix of the
// next turn's.
//
// Blocks: the prompt cut into --block-tokens pieces (the last one partial),
// each identified by a hash chained over the previous block's hash and its
// own tokens (SHA-1), renumbered 0, 1, 2... by first appearance like the
// Mooncake release.
//
// Arrivals: conversations start as a Poisson process of --session-rate per
// second; turn j+1 arrives an exponential think time (mean --think-s,
// covering the answer and the user's reply) after turn j. A seeded PRNG
// makes the output reproducible. Lines are in arrival order, ties by
// conversation then turn; timestamps in whole milliseconds.
import fs from 'node:fs';
import crypto from 'node:crypto';
import llama3Tokenizer from 'llama3-tokenizer-js';

const BEGIN_OF_TEXT = 128000;
const START_HEADER = 128006;
const END_HEADER = 128007;
const EOT = 128009;

function parseArgs(argv) {
  const opts = { blockTokens: 512, sessionRate: 0.5, thinkS: 20, seed: 1 };
  for (let i = 2; i < argv.length; i += 2) {
    const [key, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${key} needs a value`);
    if (key === '--in') opts.in = value;
    else if (key === '--out') opts.out = value;
    else if (key === '--block-tokens') opts.blockTokens = Number(value);
    else if (key === '--session-rate') opts.sessionRate = Number(value);
    else if (key === '--think-s') opts.thinkS = Number(value);
    else if (key === '--seed') opts.seed = Number(value);
    else throw new Error(`unknown option ${key}`);
  }
  if (!opts.in || !opts.out) throw new Error('--in and --out are required');
  if (!(opts.blockTokens >= 1) || !(opts.sessionRate > 0) || !(opts.thinkS >= 0)) {
    throw new Error('--block-tokens >= 1, --session-rate > 0 and --think-s >= 0');
  }
  return opts;
}

// mulberry32: a small seeded PRNG, uniform in [0, 1).
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function exponential(random, mean) {
  return -Math.log(1 - random()) * mean;
}

function header(role) {
  return [START_HEADER, ...llama3Tokenizer.encode(role, { bos: false, eos: false }), END_HEADER,
          ...llama3Tokenizer.encode('\n\n', { bos: false, eos: false })];
}

function messageTokens(message) {
  return [...header(message.role), ...llama3Tokenizer.encode(message.content, { bos: false, eos: false }), EOT];
}

function main() {
  const opts = parseArgs(process.argv);
  const conversations = JSON.parse(fs.readFileSync(opts.in, 'utf8'));
  if (!Array.isArray(conversations)) throw new Error(`${opts.in}: expected a JSON array of conversations`);
  const random = prng(opts.seed);
  const ids = new Map();
  const requests = [];
  let sessionStart = 0;
  conversations.forEach((conv, c) => {
    if (!Array.isArray(conv.messages)) throw new Error(`${opts.in}: conversation ${c} has no "messages" array`);
    sessionStart += exponential(random, 1 / opts.sessionRate);
    let arrival = sessionStart;
    const assistantHeader = header('assistant');
    let context = [BEGIN_OF_TEXT];
    for (let j = 1; 2 * j - 1 <= conv.messages.length; ++j) {
      const user = conv.messages[2 * j - 2];
      const answer = conv.messages[2 * j - 1];
      if (!user || user.role !== 'user') throw new Error(`${opts.in}: conversation ${c}, message ${2 * j - 1} is not the user's`);
      context = context.concat(messageTokens(user));
      const prompt = context.concat(assistantHeader);
      const hashIds = [];
      let previous = '';
      for (let start = 0; start < prompt.length; start += opts.blockTokens) {
        const block = prompt.slice(start, start + opts.blockTokens);
        const digest = crypto.createHash('sha1').update(previous).update(Uint32Array.from(block)).digest('hex');
        if (!ids.has(digest)) ids.set(digest, ids.size);
        hashIds.push(ids.get(digest));
        previous = digest;
      }
      const outputTokens = answer ? llama3Tokenizer.encode(answer.content, { bos: false, eos: false }).length : 0;
      requests.push({ timestamp: Math.floor(arrival * 1000), session: c + 1, turn: j, input_length: prompt.length,
                      output_length: outputTokens, hash_ids: hashIds });
      if (answer) context = context.concat(messageTokens(answer));
      arrival += exponential(random, opts.thinkS);
    }
  });
  requests.sort((a, b) => a.timestamp - b.timestamp || a.session - b.session || a.turn - b.turn);
  const lines = requests.map((r) => JSON.stringify({ timestamp: r.timestamp, input_length: r.input_length,
                                                     output_length: r.output_length, hash_ids: r.hash_ids,
                                                     session: r.session, turn: r.turn }));
  fs.writeFileSync(opts.out, lines.join('\n') + '\n');
  process.stderr.write(`${requests.length} requests from ${conversations.length} conversations, ${ids.size} blocks\n`);
}

main();
