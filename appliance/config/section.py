"""What every config section shares: frozen, unknown keys refused, problems named by key.

A domain policy states its own limits (`appliance.domain.limits.InvariantError`); a section
builds the policy in a validator and reports the policy's problems under the yaml keys that set
them, so `appliance config check` and the daemon's exit 2 name the key and the limit while the
limit itself is written once, in the domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from appliance.domain.limits import InvariantError


class Section(BaseModel):
    """A frozen config section that rejects unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def key_path(loc: Iterable[Any]) -> str:
    """A pydantic location as a dotted yaml key ("<root>" for the file itself)."""
    return ".".join(str(p) for p in loc) or "<root>"


class SectionProblems(ValueError):
    """Problems of one section, each as (key, message), the key relative to the section
    ("" for the section itself)."""

    def __init__(self, problems: Iterable[tuple[str, str]]):
        self.problems = list(problems)
        super().__init__("; ".join(f"{key}: {msg}" if key else msg for key, msg in self.problems))

    def keyed(self, loc: tuple[Any, ...]) -> list[tuple[str, str]]:
        """The problems under their full keys, given where the section sits in the file."""
        return [(key_path((*loc, key) if key else loc), msg) for key, msg in self.problems]


class CrossFieldError(SectionProblems):
    """Problems that name keys of more than one section: every key is full (from the root)."""

    def keyed(self, loc: tuple[Any, ...]) -> list[tuple[str, str]]:
        """The problems as they are: their keys are full already."""
        return list(self.problems)


def policy_problems(exc: InvariantError, key_of: Mapping[str, str]) -> list[tuple[str, str]]:
    """A policy's problems as (key, message): `key_of` maps a policy field to the key that sets
    it (a field not in it keeps its name), in the key and wherever a message names the field."""
    return [(key_of.get(p.field, p.field), p.render(key_of)) for p in exc.problems]
