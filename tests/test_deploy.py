"""The deployment files carry every hardening setting (no container engine runs here, so they are parsed).

Dockerfiles: multi-stage, slim base, numeric non-root user, no writes needed
outside /tmp. Compose: read-only, no capabilities, no-new-privileges, PID
limits, tmpfs scratch, PostgreSQL and Redis with AOF. Kubernetes: separate
Deployments per role with the restricted security context, gRPC probes,
resources, and HPAs for the language servers.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ROLES = ("coordinator", "worker", "langserver-python", "langserver-js")
OUR_SERVICES = ("coordinator", "worker", "langserver-python", "langserver-js")
GRPC_ROLES = {"coordinator": 50051, "langserver-python": 50053, "langserver-js": 50052}


def _dockerfile_stages(text: str) -> list[list[tuple[str, str]]]:
    """The instructions of each stage, as (INSTRUCTION, arguments), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        assert stages, f"instruction before FROM: {line}"
        stages[-1].append((instruction.upper(), rest.strip()))
    return stages


@pytest.mark.parametrize("role", ROLES)
def test_dockerfile_is_multi_stage_slim_non_root_and_read_only_ready(role: str) -> None:
    stages = _dockerfile_stages((DEPLOY / "docker" / f"{role}.Dockerfile").read_text())
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    base = final[0][1].split()[0]
    assert base.endswith("-slim") or "distroless" in base, f"slim runtime base, not {base}"
    assert any(i == "COPY" and "--from=" in a for i, a in final), "the runtime stage copies from the build stage"
    assert not any(i == "RUN" and "pip install" in a for i, a in final), "nothing is built in the runtime stage"
    users = [a for i, a in final if i == "USER"]
    assert users, "the runtime stage sets a user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0)), "numeric non-root uid"
    env = " ".join(a for i, a in final if i == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env, "no .pyc writes on a read-only root"
    assert "HOME=/tmp" in env, "anything that writes to $HOME lands on the tmpfs"
    entrypoint = [a for i, a in final if i == "ENTRYPOINT"]
    assert entrypoint and entrypoint[-1].startswith("["), "exec form: the process is PID 1 and gets SIGTERM"
    assert any(i == "HEALTHCHECK" for i, _ in final)
    expected = "coordinator" if role == "coordinator" else f"--role {role}"
    assert expected in " ".join(shlex.split(entrypoint[-1].replace(",", " ").strip("[]")))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return document


def test_compose_hardens_every_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(OUR_SERVICES) | {"postgres", "redis"} <= set(services)
    for name, service in services.items():
        assert service.get("read_only") is True, f"{name}: read_only"
        assert service.get("cap_drop") == ["ALL"], f"{name}: cap_drop ALL"
        assert "no-new-privileges:true" in service.get("security_opt", []), f"{name}: no-new-privileges"
        assert isinstance(service.get("pids_limit"), int) and 0 < service["pids_limit"] <= 4096, f"{name}: pids_limit"
        assert any(str(t).startswith("/tmp") for t in service.get("tmpfs", [])), f"{name}: tmpfs for scratch"
        assert "privileged" not in service and "cap_add" not in service, f"{name}: no privileges added back"
        user = str(service.get("user", ""))
        assert user and user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0, f"{name}: non-root numeric user"
    for name in OUR_SERVICES:
        assert services[name].get("mem_limit"), f"{name}: memory limit"


def test_compose_runs_postgres_and_redis_with_aof_and_volumes(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    assert any("/var/lib/postgresql/data" in v for v in services["postgres"]["volumes"])
    redis = services["redis"]
    command = [str(part) for part in redis["command"]]
    assert command[command.index("--appendonly") + 1] == "yes", "Redis keeps an append-only file"
    assert command[command.index("--appendfsync") + 1] in ("everysec", "always")
    assert "--requirepass" in command
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert {"pgdata", "redisdata"} <= set(compose["volumes"])


def test_compose_wires_the_roles_and_isolates_the_language_servers(compose: dict[str, Any]) -> None:
    services = compose["services"]
    worker_env = services["worker"]["environment"]
    assert worker_env["LANG_WORKER_ADDRS"] == "python:langserver-python:50053,js:langserver-js:50052"
    assert worker_env["COORDINATOR_ADDR"] == "coordinator:50051"
    assert compose["networks"]["sandbox"]["internal"] is True
    for name in ("langserver-python", "langserver-js"):
        assert services[name]["networks"] == ["sandbox"], f"{name}: reachable only on the internal network"
        assert "ports" not in services[name]
    assert set(services["worker"]["networks"]) == {"backend", "sandbox"}
    for name in ("worker", "langserver-python", "langserver-js"):
        assert services[name]["stop_grace_period"] in ("40s", "45s"), f"{name}: time to drain on docker stop"
    published = [p for s in services.values() for p in s.get("ports", [])]
    assert published == ["127.0.0.1:50051:50051"], "only the coordinator, only on loopback"


def _k8s_documents() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _k8s_documents() if d["kind"] == kind}


def test_k8s_has_a_separate_deployment_per_role() -> None:
    deployments = _by_kind("Deployment")
    assert set(deployments) == set(ROLES)
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == name
        assert deployment["spec"]["selector"]["matchLabels"] == labels, "each scales on its own"


@pytest.mark.parametrize("role", ROLES)
def test_k8s_pods_use_the_restricted_security_context(role: str) -> None:
    pod = _by_kind("Deployment")[role]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"] and "add" not in context["capabilities"]
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}
        assert context.get("privileged", False) is False
        resources = container["resources"]
        for kind in ("requests", "limits"):
            assert resources[kind]["cpu"] and resources[kind]["memory"], f"{role}: {kind}"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        tmp = next(v for v in pod["volumes"] if v["name"] == mounts["/tmp"])
        assert "emptyDir" in tmp and tmp["emptyDir"]["sizeLimit"], "bounded scratch space"


@pytest.mark.parametrize("role", sorted(GRPC_ROLES))
def test_k8s_grpc_services_have_grpc_health_probes(role: str) -> None:
    container = _by_kind("Deployment")[role]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["grpc"]["port"] == GRPC_ROLES[role], f"{role}: {probe}"
    if role.startswith("langserver"):
        assert container["readinessProbe"]["grpc"]["service"] == "langserver.v1.LanguageServer"


def test_k8s_worker_probes_its_health_endpoints_and_drains_within_its_grace_period() -> None:
    pod = _by_kind("Deployment")["worker"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LANG_WORKER_ADDRS"] == "python:langserver-python:50053,js:langserver-js:50052"
    drain = float(env["WORKER_SHUTDOWN_GRACE_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > drain + 5, "the worker can drain before the kubelet SIGKILLs it"


@pytest.mark.parametrize("role", ["langserver-python", "langserver-js"])
def test_k8s_language_servers_autoscale(role: str) -> None:
    hpa = _by_kind("HorizontalPodAutoscaler")[role]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": role}
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    assert any(m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])
    pod = _by_kind("Deployment")[role]["spec"]["template"]["spec"]
    # The supervisor gives a draining language server 35 s (SUPERVISOR_LANGSERVER_STOP_SECONDS) before SIGKILL.
    assert pod["terminationGracePeriodSeconds"] > 35
    service = _by_kind("Service")[role]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == role


def test_k8s_namespace_enforces_restricted_and_language_servers_have_no_egress() -> None:
    namespace = _by_kind("Namespace")["durable-workflows"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    policy = _by_kind("NetworkPolicy")["langservers-only-from-workers"]
    assert "Egress" in policy["spec"]["policyTypes"] and policy["spec"]["egress"] == []
    sources = policy["spec"]["ingress"][0]["from"]
    assert sources == [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}}}]
    secrets = _by_kind("Secret")
    assert all("CHANGE-ME" in str(s["stringData"]) for s in secrets.values()), "only an example secret is shipped"


def test_language_server_memory_ceiling_sits_below_the_container_limit(compose: dict[str, Any]) -> None:
    """The supervisor restarts a language server gracefully before the kernel OOM-kills the container."""
    units = {"g": 1024, "Gi": 1024, "m": 1, "Mi": 1}

    def mib(value: str) -> int:
        number = value.rstrip("GgMmi")
        return int(number) * units[value[len(number) :]]

    for role in ("langserver-python", "langserver-js"):
        service = compose["services"][role]
        ceiling = int(service["environment"]["SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB"])
        assert 0 < ceiling < mib(service["mem_limit"]), role
        container = _by_kind("Deployment")[role]["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert 0 < int(env["SUPERVISOR_LANGSERVER_MEMORY_LIMIT_MB"]) < mib(container["resources"]["limits"]["memory"])
