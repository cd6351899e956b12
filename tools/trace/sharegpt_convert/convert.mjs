// Converts ShareGPT conversations into kvtier's block-trace JSONL, the
// Mooncake form plus "session" and "turn" (docs/REPLAY.md, "ShareGPT").
//
//   node convert.mjs --in FILE.json --out FILE.jsonl [--block-tokens 512]
//       [--session-rate 0.5] [--think-s 20] [--seed 1] [--conversations N]
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
// Conversations: without --conversations, each input conversation once, in
// file order (session c + 1 for the c-th). With --conversations N, N draws:
// the draws come in passes, each pass a seeded random permutation of all
// input conversations, so N up to the input's size draws without
// replacement and a larger N repeats every conversation N / size times
// (rounded up or down). Draw i is session i + 1: a session id is never
// reused. The k-th repeat of a conversation (k >= 1; the first draw is k = 0)
// is salted: its block 0 hash starts from "copy k" instead of nothing, so
// its whole chain gets new ids and copies of one conversation never share
// a block (they would otherwise hit on text no second user sent). First
// draws keep their unsalted hashes, so blocks that different conversations
// genuinely share (the same opening) stay shared, as they are without
// --conversations; so do the k-th copies of those conversations.
//
// Arrivals: conversations (draws) start as a Poisson process of
// --session-rate per second; turn j+1 arrives an exponential think time
// (mean --think-s, covering the answer and the user's reply) after turn j.
// Seeded PRNGs (one for arrivals, one for the draws) make the output
// reproducible byte for byte. Lines are in arrival order, ties by
// conversation then turn; timestamps in whole milliseconds.
//
// Errors (a bad option or input) print "convert.mjs: ..." and exit 2.
import fs from 'node:fs';
import crypto from 'node:crypto';

const BEGIN_OF_TEXT = 128000;
const START_HEADER = 128006;
const END_HEADER = 128007;
const EOT = 128009;

// Loaded after the options are checked (loading takes seconds).
let llama3Tokenizer;

class UsageError extends Error {}

function parseArgs(argv) {
  const opts = { blockTokens: 512, sessionRate: 0.5, thinkS: 20, seed: 1, conversations: undefined };
  for (let i = 2; i < argv.length; i += 2) {
    const [key, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new UsageError(`${key} needs a value`);
    if (key === '--in') opts.in = value;
    else if (key === '--out') opts.out = value;
    else if (key === '--block-tokens') opts.blockTokens = Number(value);
    else if (key === '--session-rate') opts.sessionRate = Number(value);
    else if (key === '--think-s') opts.thinkS = Number(value);
    else if (key === '--seed') opts.seed = Number(value);
    else if (key === '--conversations') opts.conversations = Number(value);
    else throw new UsageError(`unknown option ${key}`);
  }
  if (!opts.in || !opts.out) throw new UsageError('--in and --out are required');
  if (!Number.isInteger(opts.blockTokens) || opts.blockTokens < 1) throw new UsageError('--block-tokens must be a whole number >= 1');
  if (!(opts.sessionRate > 0) || !Number.isFinite(opts.sessionRate)) throw new UsageError('--session-rate must be > 0');
  if (!(opts.thinkS >= 0) || !Number.isFinite(opts.thinkS)) throw new UsageError('--think-s must be >= 0');
  if (!Number.isInteger(opts.seed) || opts.seed < 0) throw new UsageError('--seed must be a whole number >= 0');
  if (opts.conversations !== undefined && (!Number.isInteger(opts.conversations) || opts.conversations < 1)) {
    throw new UsageError('--conversations must be a whole number >= 1');
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

// The input conversations to run, in order: [{ index, copy }], copy = how
// many earlier draws took the same conversation (the header's rules).
function draws(count, wanted, seed) {
  if (wanted === undefined) return Array.from({ length: count }, (_, index) => ({ index, copy: 0 }));
  const random = prng(seed ^ 0x5bd1e995);  // its own stream: the arrival draws stay as without --conversations
  const copies = new Array(count).fill(0);
  const out = [];
  while (out.length < wanted) {
    const pass = Array.from({ length: count }, (_, i) => i);
    for (let i = count - 1; i > 0; --i) {  // Fisher-Yates
      const j = Math.floor(random() * (i + 1));
      [pass[i], pass[j]] = [pass[j], pass[i]];
    }
    for (const index of pass.slice(0, wanted - out.length)) out.push({ index, copy: copies[index]++ });
  }
  return out;
}

// Each conversation's turns as token arrays, tokenized once however often drawn.
function conversationTurns(conv, c, where) {
  if (!conv || !Array.isArray(conv.messages)) throw new UsageError(`${where}: conversation ${c} has no "messages" array`);
  const assistantHeader = header('assistant');
  const turns = [];
  let context = [BEGIN_OF_TEXT];
  for (let j = 1; 2 * j - 1 <= conv.messages.length; ++j) {
    const user = conv.messages[2 * j - 2];
    const answer = conv.messages[2 * j - 1];
    if (!user || user.role !== 'user') throw new UsageError(`${where}: conversation ${c}, message ${2 * j - 1} is not the user's`);
    context = context.concat(messageTokens(user));
    const outputTokens = answer ? llama3Tokenizer.encode(answer.content, { bos: false, eos: false }).length : 0;
    turns.push({ prompt: context.concat(assistantHeader), outputTokens });
    if (answer) context = context.concat(messageTokens(answer));
  }
  return turns;
}

async function main() {
  const opts = parseArgs(process.argv);
  llama3Tokenizer = (await import('llama3-tokenizer-js')).default;
  let conversations;
  try {
    conversations = JSON.parse(fs.readFileSync(opts.in, 'utf8'));
  } catch (e) {
    throw new UsageError(`${opts.in}: ${e.message}`);
  }
  if (!Array.isArray(conversations) || conversations.length === 0) {
    throw new UsageError(`${opts.in}: expected a non-empty JSON array of conversations`);
  }
  const random = prng(opts.seed);
  const ids = new Map();
  const requests = [];
  const tokenized = new Map();
  let sessionStart = 0;
  draws(conversations.length, opts.conversations, opts.seed).forEach(({ index, copy }, d) => {
    if (!tokenized.has(index)) tokenized.set(index, conversationTurns(conversations[index], index, opts.in));
    sessionStart += exponential(random, 1 / opts.sessionRate);
    let arrival = sessionStart;
    tokenized.get(index).forEach(({ prompt, outputTokens }, t) => {
      const hashIds = [];
      let previous = copy === 0 ? '' : `copy ${copy}`;
      for (let start = 0; start < prompt.length; start += opts.blockTokens) {
        const block = prompt.slice(start, start + opts.blockTokens);
        const digest = crypto.createHash('sha1').update(previous).update(Uint32Array.from(block)).digest('hex');
        if (!ids.has(digest)) ids.set(digest, ids.size);
        hashIds.push(ids.get(digest));
        previous = digest;
      }
      requests.push({ timestamp: Math.floor(arrival * 1000), session: d + 1, turn: t + 1, input_length: prompt.length,
                      output_length: outputTokens, hash_ids: hashIds });
      arrival += exponential(random, opts.thinkS);
    });
  });
  requests.sort((a, b) => a.timestamp - b.timestamp || a.session - b.session || a.turn - b.turn);
  const lines = requests.map((r) => JSON.stringify({ timestamp: r.timestamp, input_length: r.input_length,
                                                     output_length: r.output_length, hash_ids: r.hash_ids,
                                                     session: r.session, turn: r.turn }));
  fs.writeFileSync(opts.out, lines.join('\n') + '\n');
  const sessions = opts.conversations ?? conversations.length;
  process.stderr.write(`${requests.length} requests from ${sessions} conversations (${conversations.length} in the input), ` +
                       `${ids.size} blocks\n`);
}

try {
  await main();
} catch (e) {
  if (!(e instanceof UsageError)) throw e;
  process.stderr.write(`convert.mjs: ${e.message}\n`);
  process.exit(2);
}
