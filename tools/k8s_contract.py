"""``python tools/k8s_contract.py RENDERED.yaml [base|overlay]``: the runtime contract of
docs/kubernetes.md on the objects ``kubectl kustomize`` rendered from k8s/base or one of k8s/overlays/
(.ci/k8s-validate runs it on each; exit status 1 on any failure). ``overlay`` is the default.

The checks live in tools/k8s_contract_checks/, one module per concern (its ``__init__`` says which).
"""

import sys

import yaml
from k8s_contract_checks import run  # beside this script, which puts its folder on sys.path


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    contract = run(docs, overlay=(argv[2] if len(argv) > 2 else "overlay") == "overlay")
    for p in contract.problems:
        print(f"FAILED: {p}")
    print(f"{contract.count - len(contract.problems)}/{contract.count} checks passed")
    return 1 if contract.problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
