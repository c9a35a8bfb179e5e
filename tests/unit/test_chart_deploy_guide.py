"""docs/deploy.md's instructions match the Helm chart: its values file installs, and every object the
guide tells to inspect is one the release creates.
"""

from __future__ import annotations

import re

import yaml

from chart_checks import KUBERNETES_VERSIONS, ROOT, manifests, render, schema_problems


def test_the_deploy_guides_values_file_installs() -> None:
    """The values file of docs/deploy.md renders and validates, and every object the guide tells to
    inspect (`job/...`, `svc/...`, `deploy/...`) is one the release creates."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"```yaml\n# my-values\.yaml\n(.*?)```", text, re.DOTALL)
    assert match, "docs/deploy.md: the my-values.yaml example is missing"
    docs = manifests(render(yaml.safe_load(match.group(1))))
    for version in KUBERNETES_VERSIONS:
        assert schema_problems(docs, version) == []
    kinds = {"job": "Job", "svc": "Service", "deploy": "Deployment"}
    created = {(doc["kind"], doc["metadata"]["name"]) for doc in docs}
    mentioned = set(re.findall(r"\b(job|svc|deploy)/(graphledger-[a-z-]+)", text))
    assert {("job", "graphledger-topics"), ("svc", "graphledger-read-api")} <= mentioned
    for short, name in mentioned:
        assert (kinds[short], name) in created, f"docs/deploy.md mentions {short}/{name}, not in the release"
