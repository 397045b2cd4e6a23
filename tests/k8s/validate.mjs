// Validate prometheus-operator custom resources (YAML documents on stdin) against the schemas
// generated from the operator's CRDs. Prints one line per object; exits 1 if any is invalid.
import * as yaml from "js-yaml";
import * as operator from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const input = await new Promise((done) => {
  let text = "";
  process.stdin.on("data", (chunk) => (text += chunk)).on("end", () => done(text));
});
let failed = 0;
for (const doc of yaml.loadAll(input)) {
  if (!doc || doc.apiVersion !== "monitoring.coreos.com/v1") continue;
  const Model = operator[doc.kind];
  if (!Model) { console.log(`UNKNOWN ${doc.kind}`); failed++; continue; }
  try {
    new Model(doc).validate();
    console.log(`VALID ${doc.kind}/${doc.metadata.name}`);
  } catch (error) {
    console.log(`INVALID ${doc.kind}/${doc.metadata.name}: ${error.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
