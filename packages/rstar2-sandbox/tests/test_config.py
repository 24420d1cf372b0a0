import pytest
from pydantic import ValidationError

from rstar2_sandbox import SandboxConfig


def test_defaults_validate_and_are_frozen():
    config = SandboxConfig()
    assert config == SandboxConfig.model_validate(config.model_dump())
    with pytest.raises(ValidationError):
        config.__class__.model_validate({**config.model_dump(), "no_such_field": 1})


def test_every_field_is_documented():
    for name, field in SandboxConfig.model_fields.items():
        assert field.description, f"{name} has no description"


def test_inconsistent_settings_are_refused():
    from rstar2_sandbox import ServerConfig

    with pytest.raises(ValidationError, match="default_timeout_s must not exceed"):
        SandboxConfig(default_timeout_s=10, max_timeout_s=5)
    with pytest.raises(ValidationError, match="at most 1000"):
        SandboxConfig(workers=1, max_in_flight=990, max_sessions=64)
    # the limit is per worker (each has 1000 uids): a node of the paper's scale validates
    assert SandboxConfig(workers=64, max_in_flight=1024).max_in_flight == 1024
    with pytest.raises(ValidationError, match="go together"):
        ServerConfig(tls_cert_file="cert.pem")


def test_cgroup_limits_cover_what_a_worker_may_hold():
    """A worker's share of the calls in flight (the least busy worker gets the next call),
    each with its address-space headroom and its /tmp, plus 1 GiB for the worker, zygote and
    sessions; 64 tasks per call or session it may hold. Explicit values win."""
    config = SandboxConfig(workers=3, max_in_flight=8, max_sessions=2)
    per_call = config.memory_bytes + config.tmpfs_bytes
    assert config.cgroup_limits() == {"memory.max": 3 * per_call + (1 << 30), "pids.max": 336}
    config = SandboxConfig(worker_memory_bytes=1 << 31, worker_pids=100)
    assert config.cgroup_limits() == {"memory.max": 1 << 31, "pids.max": 100}
