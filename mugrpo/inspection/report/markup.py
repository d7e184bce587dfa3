"""The HTML pieces every section of the report uses: a table, a confidence interval."""

from __future__ import annotations

import html


def ci(low, high) -> str:
    return f"[{low:.3f}, {high:.3f}]" if low is not None and high is not None else "[-]"


def table(headers: list[str], rows: list[list]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f'<td class="num">{v:.3f}</td>'
        if isinstance(v, int):
            return f'<td class="num">{v}</td>'
        return f"<td>{html.escape(str(v))}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
