// The reference for tokenizer_gpt2.sh: the npm package gpt-3-encoder's encode() of a UTF-8 file,
// ids space-separated on one line; its encoding time (seconds) on stderr.
// Usage: node tokenizer_gpt2_ref.js PACKAGE_DIR FILE
const { encode } = require(require('path').resolve(process.argv[2]));
const fs = require('fs');
const text = fs.readFileSync(process.argv[3], 'utf8');
// The package's encode() grows its output array quadratically, so the text goes in pieces cut
// after "\n" between two non-spaces: no match of GPT-2's pattern spans such a cut, so
// encode(a + b) == encode(a) + encode(b) there.
const pieces = text.split(/(?<=\S\n)(?=\S)/u);
const start = process.hrtime.bigint();
const ids = [];
for (const piece of pieces) for (const id of encode(piece)) ids.push(id);
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stdout.write(ids.join(' ') + '\n');
process.stderr.write(`gpt-3-encoder: ${seconds.toFixed(3)} s\n`);
