// Tests of convert.mjs on a small inline ShareGPT file: `npm test` (node's
// built-in runner; needs `npm ci` once for the tokenizer, so it is not part
// of ctest: CI has no npm registry).
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sharegpt-convert-'));
const input = path.join(dir, 'in.json');
after(() => fs.rmSync(dir, { recursive: true, force: true }));
const turn = (u, a) => [{ role: 'user', content: u }, { role: 'assistant', content: a }];
// Four conversations of 2, 1, 3 and 2 turns; A and D open with the same question.
fs.writeFileSync(input, JSON.stringify([
  { id: 'A', messages: [...turn('What is a KV cache?', 'It stores attention keys and values.'),
                        ...turn('Why tier it?', 'DRAM is small; flash is large and slower.')] },
  { id: 'B', messages: turn('Name a prime.', 'Seven.') },
  { id: 'C', messages: [...turn('Count to three.', 'One, two, three.'), ...turn('And back?', 'Three, two, one.'),
                        ...turn('Thanks.', 'You are welcome.')] },
  { id: 'D', messages: [...turn('What is a KV cache?', 'A cache of keys and values.'),
                        ...turn('Is it big?', 'Often larger than the model.')] },
]));

function convert(...args) {
  const out = path.join(dir, `out-${Math.random().toString(36).slice(2)}.jsonl`);
  execFileSync(process.execPath, [path.join(here, 'convert.mjs'), '--in', input, '--out', out, ...args],
               { stdio: ['ignore', 'ignore', 'pipe'] });
  const text = fs.readFileSync(out, 'utf8');
  return { text, lines: text.trim().split('\n').map((l) => JSON.parse(l)) };
}

// session -> its lines in turn order.
function bySession(lines) {
  const m = new Map();
  for (const l of lines) m.set(l.session, [...(m.get(l.session) ?? []), l]);
  for (const turns of m.values()) turns.sort((a, b) => a.turn - b.turn);
  return m;
}

// A conversation's shape: its turns' prompt and output lengths.
const shape = (turns) => turns.map((t) => `${t.input_length}/${t.output_length}`).join(' ');

const base = convert('--block-tokens', '4');
const sourceOf = new Map([...bySession(base.lines)].map(([s, turns]) => [shape(turns), s]));

test('without --conversations each conversation runs once, in file order', () => {
  const sessions = bySession(base.lines);
  assert.deepEqual([...sessions.keys()].sort(), [1, 2, 3, 4]);
  assert.deepEqual([1, 2, 3, 4].map((s) => sessions.get(s).length), [2, 1, 3, 2]);
  assert.equal(sourceOf.size, 4, 'the fixture conversations have distinct shapes');
  // Block 0 is the chat template's first 4 tokens: the same for everyone.
  assert.equal(new Set(base.lines.map((l) => l.hash_ids[0])).size, 1);
});

test('the same seed gives the same bytes; another seed other arrivals and draws', () => {
  assert.equal(convert('--block-tokens', '4').text, base.text);
  const a = convert('--block-tokens', '4', '--conversations', '9');
  assert.equal(convert('--block-tokens', '4', '--conversations', '9').text, a.text);
  assert.notEqual(convert('--block-tokens', '4', '--conversations', '9', '--seed', '2').text, a.text);
});

test('up to the input size, conversations are drawn without replacement and not salted', () => {
  const { lines } = convert('--block-tokens', '4', '--conversations', '4');
  const sessions = bySession(lines);
  assert.deepEqual([...sessions.keys()].sort(), [1, 2, 3, 4]);
  assert.deepEqual(new Set([...sessions.values()].map((t) => sourceOf.get(shape(t)))), new Set([1, 2, 3, 4]));
  assert.equal(new Set(lines.flatMap((l) => l.hash_ids)).size, new Set(base.lines.flatMap((l) => l.hash_ids)).size);
});

test('past the input size every conversation repeats, each copy a new session with its own blocks', () => {
  const { lines } = convert('--block-tokens', '4', '--conversations', '10');
  const sessions = bySession(lines);
  assert.deepEqual([...sessions.keys()].sort((a, b) => a - b), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  const copies = new Map();  // source -> its sessions, in draw order
  for (const [s, turns] of [...sessions].sort((a, b) => a[0] - b[0])) {
    const source = sourceOf.get(shape(turns));
    assert.ok(source, `session ${s} has the shape of an input conversation`);
    copies.set(source, [...(copies.get(source) ?? []), s]);
  }
  // Passes of permutations: 10 draws of 4 conversations, each 2 or 3 times.
  for (const ss of copies.values()) assert.ok(ss.length === 2 || ss.length === 3, `${ss}`);
  const ids = (s) => new Set(sessions.get(s).flatMap((t) => t.hash_ids));
  const copyIndex = new Map();
  for (const ss of copies.values()) ss.forEach((s, k) => copyIndex.set(s, k));
  for (const a of sessions.keys()) {
    for (const b of sessions.keys()) {
      if (a >= b) continue;
      const shared = [...ids(a)].filter((id) => ids(b).has(id));
      if (copyIndex.get(a) !== copyIndex.get(b)) {
        assert.deepEqual(shared, [], `sessions ${a} and ${b} (different copies) share no block`);
      } else {
        // The k-th copies share what the originals share: at least the template block.
        assert.ok(shared.includes(sessions.get(a)[0].hash_ids[0]), `sessions ${a} and ${b} share block 0`);
      }
    }
  }
  // Conversations start in session order (a Poisson process of starts).
  const starts = [...sessions.keys()].sort((a, b) => a - b).map((s) => sessions.get(s)[0].timestamp);
  assert.deepEqual(starts, [...starts].sort((a, b) => a - b));
  // Lines are in arrival order.
  assert.deepEqual(lines.map((l) => l.timestamp), lines.map((l) => l.timestamp).sort((a, b) => a - b));
});

test('bad values exit 2 with a message', () => {
  for (const args of [['--conversations', '0'], ['--conversations', '1.5'], ['--conversations', 'x'],
                      ['--block-tokens', '0'], ['--session-rate', '0'], ['--think-s', '-1'], ['--seed', '-1'],
                      ['--bogus', '1'], ['--conversations']]) {
    const r = spawnSync(process.execPath, [path.join(here, 'convert.mjs'), '--in', input, '--out',
                                           path.join(dir, 'bad.jsonl'), ...args], { encoding: 'utf8' });
    assert.equal(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, /^convert\.mjs: /, args.join(' '));
  }
});
