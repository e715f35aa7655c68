"""What a template descriptor declares: one Jinja template's contract in Python."""

from __future__ import annotations

from typing import Any, ClassVar

from ..spec import KernelSpec, TuningParams


class Template:
    """One Jinja template: the variants it renders (its direction and ``TuningParams.gluon``
    values), the rules on top of the common ones that say which specs and params it renders,
    and the Jinja variables it reads and how they derive from the spec and params.

    ``triton`` is the (major, minor) of the Triton the code is for (None: the installed); a
    template's text may differ by version only through a flag here."""

    file: ClassVar[str]
    direction: ClassVar[str]
    gluon: ClassVar[tuple[int, ...]]

    def flags(self, spec: KernelSpec, params: TuningParams, triton: tuple[int, int] | None) -> dict[str, Any]:
        """The template's Jinja variables beyond ``name``, ``spec_repr`` and ``params``."""
        return {}

    def variables(
        self, spec: KernelSpec, params: TuningParams, name: str, triton: tuple[int, int] | None = None
    ) -> dict[str, Any]:
        """Everything the template reads: the module's name, the validated spec as a safe Python
        literal, the params, and the flags."""
        return {"name": name, "spec_repr": repr(spec.to_dict()), "params": params, **self.flags(spec, params, triton)}

    def unsupported(self, spec: KernelSpec, params: TuningParams) -> str | None:
        """Why the template cannot render ``params`` for ``spec``, beyond the common rules."""
        return None
