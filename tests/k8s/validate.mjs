// Validate prometheus-operator custom resources (YAML documents on stdin) against the schemas
// generated from the operator's CRDs. Prints one line per object; exits 1 if any is invalid.
import * as yaml from "js-yaml";
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as v1alpha1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1alpha1";

// The versions of monitoring.coreos.com the manifests use (AlertmanagerConfig is v1alpha1).
const versions = { "monitoring.coreos.com/v1": v1, "monitoring.coreos.com/v1alpha1": v1alpha1 };

const input = await new Promise((done) => {
  let text = "";
  process.stdin.on("data", (chunk) => (text += chunk)).on("end", () => done(text));
});
let failed = 0;
for (const doc of yaml.loadAll(input)) {
  if (!doc || !versions[doc.apiVersion]) continue;
  const Model = versions[doc.apiVersion][doc.kind];
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
