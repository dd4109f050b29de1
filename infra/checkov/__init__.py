# Project checkov policies for infra/ (loaded by scripts/lint-infra.sh with
# --external-checks-dir infra/checkov). Each module holds one check.
