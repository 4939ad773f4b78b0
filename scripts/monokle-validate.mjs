// Monokle's offline plugins on a kustomize output: Pod Security Standards and its common
// practices (a kube-linter-like rule set), the second reviewer of scripts/validate-deploy.
//   node scripts/monokle-validate.mjs MANIFESTS.yaml   (with @monokle/validation and yaml installed
//   from npm where node resolves them: scripts/validate-deploy does that)
// Its OPA plugin fetches its policy bundle at run time, so it is not used (no network here).
import {readFileSync} from 'node:fs';
import {parseAllDocuments} from 'yaml';
import {createDefaultMonokleValidator} from '@monokle/validation';

const file = process.argv[2];
const text = readFileSync(file, 'utf8');
const resources = [];
let offset = 0;
for (const doc of parseAllDocuments(text)) {
  const content = doc.toJS();
  if (!content) continue;
  const id = `${content.kind}-${content.metadata.name}-${resources.length}`;
  resources.push({id, fileId: file, filePath: file, fileOffset: doc.range[0], text: String(doc), content,
                  kind: content.kind, name: content.metadata.name, apiVersion: content.apiVersion,
                  namespace: content.metadata.namespace});
}
const validator = createDefaultMonokleValidator();
await validator.preload({plugins: {'pod-security-standards': true, 'practices': true}});
const response = await validator.validate({resources});
const counts = {};
for (const run of response.runs) {
  const rules = Object.fromEntries([...(run.tool.driver.rules ?? []), ...(run.tool.extensions ?? []).flatMap(e => e.rules ?? [])].map(r => [r.id, r]));
  for (const r of run.results) {
    const rule = rules[r.ruleId] || {};
    const key = `${r.level} ${r.ruleId} ${rule.shortDescription?.text ?? ''}`;
    const where = r.locations?.[1]?.logicalLocations?.[0]?.fullyQualifiedName ?? '';
    (counts[key] ??= new Set()).add(where);
  }
  console.log(`${run.tool.driver.name}: ${run.results.length} results`);
}
for (const [key, where] of Object.entries(counts).sort()) console.log(`  ${key}: ${[...where].join(', ')}`);
