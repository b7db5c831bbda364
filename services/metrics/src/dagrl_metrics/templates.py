"""The dashboard's one template environment: Jinja2 with autoescaping on for every template.

Everything a page shows — job ids, node ids, phase names, metric keys, trace ids — arrives over
the unauthenticated OTLP port, so no text reaches the HTML or SVG unescaped: the templates
(`templates/*.html`, `templates/*.svg`) autoescape, and only what `render` returns (already
escaped) is passed on as markup. Links to a job quote its id as one path segment (`job_href`),
so an id with `/` or `?` still leads to its page.
"""

from __future__ import annotations

from urllib.parse import quote

import jinja2
from markupsafe import Markup

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("dagrl_metrics", "templates"),
    autoescape=True,  # every extension: .html and .svg alike
    undefined=jinja2.StrictUndefined,  # a misspelt name fails the test, not the page
    trim_blocks=True, lstrip_blocks=True)


def job_href(job_id: str, step: int | None = None) -> str:
    """The path of a job's page; the id is one path segment whatever it contains."""
    path = f"/jobs/{quote(job_id, safe='')}"
    return path if step is None else f"{path}?step={step}"


_ENV.filters["job_href"] = job_href


def render(name: str, **context: object) -> Markup:
    """Template `name` rendered with `context`; the result is escaped markup."""
    return Markup(_ENV.get_template(name).render(**context).strip())
