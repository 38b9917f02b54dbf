// Parses each AsyncAPI document named on the command line with the
// AsyncAPI parser, the Avro schema parser registered for the Avro
// payloads, and exits 1 when any diagnostic is an error (each printed),
// 2 on a wrong command line. Warnings are printed and pass; information
// and hints (such as that a newer AsyncAPI version exists) are not shown.
//
//   npm ci --prefix scripts/asyncapi-validate --ignore-scripts
//   node scripts/asyncapi-validate/validate.mjs docs/asyncapi/*.yaml
import { readFile } from 'node:fs/promises';
import { Parser, fromFile, DiagnosticSeverity } from '@asyncapi/parser';
import { AvroSchemaParser } from '@asyncapi/avro-schema-parser';

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: validate.mjs DOCUMENT...');
  process.exit(2);
}

const parser = new Parser();
parser.registerSchemaParser(AvroSchemaParser());

const severity = {
  [DiagnosticSeverity.Error]: 'error',
  [DiagnosticSeverity.Warning]: 'warning',
  [DiagnosticSeverity.Information]: 'information',
  [DiagnosticSeverity.Hint]: 'hint',
};

let failed = false;
for (const file of files) {
  await readFile(file); // a missing file fails here, naming it
  const { document, diagnostics } = await fromFile(parser, file).parse();
  let errors = 0;
  for (const d of diagnostics.filter((d) => d.severity <= DiagnosticSeverity.Warning)) {
    const at = d.range ? `${d.range.start.line + 1}:${d.range.start.character + 1}` : '-';
    const path = d.path && d.path.length ? ` (${d.path.join('.')})` : '';
    console.log(`${file}:${at}: ${severity[d.severity] ?? d.severity}: ${d.message}${path} [${d.code}]`);
    if (d.severity === DiagnosticSeverity.Error) {
      errors++;
    }
  }
  if (errors > 0 || !document) {
    failed = true;
    console.log(`${file}: invalid (${errors} error${errors === 1 ? '' : 's'})`);
  } else {
    console.log(`${file}: valid AsyncAPI ${document.version()}, ${document.channels().length} channel(s), ${document.operations().length} operation(s), ${document.messages().length} message(s)`);
  }
}
process.exit(failed ? 1 : 0);
