"""`Section`: the base of every config section of the apps: frozen, and a key the section does
not define is a mistake (`extra="forbid"`), never silently ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A config section: frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")
