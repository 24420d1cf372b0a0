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
