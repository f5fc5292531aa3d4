"""The page's structure, shared by `build` (which fills it) and `html` (which renders it).

A tier's section is a list of parts; a part is one heading with its text, figures and tables. These
types live apart from both modules so that neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .glance import TierGlance
from .store import TierRuns
from .tables import Table


@dataclass(frozen=True)
class FigureRef:
    src: str    # relative to the page
    alt: str


@dataclass
class Part:
    """One heading of a tier's section: what it says, its figures and its tables."""

    anchor: str
    heading: str
    intro: str = ""
    figures: list[FigureRef] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)


@dataclass
class TierSection:
    tier: TierRuns
    parts: list[Part]
    glance: TierGlance   # the first screen's row of this tier
