"""HTML pages from Jinja2 templates with autoescape: everything interpolated is escaped
unless a template says otherwise, so a campaign id or a segment name cannot become markup.

A package's own templates are found by name; gov.analytics' shared ones (the
``line_chart`` macro) also as ``gov.analytics/<name>``, from any package's templates."""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2

SHARED = "gov.analytics"  # the package whose templates every package can import from


@cache
def _environment(package: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader([
            jinja2.PackageLoader(package, "templates"),
            jinja2.PrefixLoader({SHARED: jinja2.PackageLoader(SHARED, "templates")}),
        ]),
        autoescape=True,  # every template here is HTML or SVG
        undefined=jinja2.StrictUndefined,  # a misspelt name fails loudly, not as an empty string
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render(template: str, package: str = "gov.analytics", **context: Any) -> str:
    """``package``'s ``templates/<template>`` rendered with ``context``."""
    return _environment(package).get_template(template).render(**context)
