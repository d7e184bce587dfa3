"""Render query results: an aligned table (default), CSV or JSON on a text stream, or a Parquet file.

Formatters live in a registry (:data:`FORMATS`); add one with ``@formatter("name")``. Nested values (token lists,
reward-component maps) stay lists and objects in JSON, and are JSON text inside CSV cells.
"""

from __future__ import annotations

import csv
import io
import json
import math
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from mugrpo.storage.store import Store


@dataclass(frozen=True)
class RenderOptions:
    """Display limits of the table format (CSV, JSON and Parquet always write every row in full)."""

    max_rows: int = 100  # rows shown; the rest are counted in a footer
    max_width: int = 60  # characters per cell before it is cut with an ellipsis
    max_list_items: int = 8  # list items shown per cell before "... (N items)"


Formatter = Callable[[pa.Table, TextIO, RenderOptions], None]
#: Output format name -> writer of an Arrow table onto a text stream.
FORMATS: dict[str, Formatter] = {}


def formatter(name: str) -> Callable[[Formatter], Formatter]:
    """Register a text output format under ``name``."""

    def deco(fn: Formatter) -> Formatter:
        FORMATS[name] = fn
        return fn

    return deco


def _python(value: Any, typ: pa.DataType) -> Any:
    """An Arrow ``to_pylist`` value made JSON-shaped: maps become dicts, recursively."""
    if value is None:
        return None
    if pa.types.is_map(typ):
        return {str(k): _python(v, typ.item_type) for k, v in value}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return [_python(v, typ.value_type) for v in value]
    if pa.types.is_struct(typ):
        return {f.name: _python(value[f.name], f.type) for f in typ}
    return value


def rows(table: pa.Table) -> list[list[Any]]:
    """The rows of ``table`` as lists of JSON-shaped Python values."""
    types = table.schema.types
    return [[_python(v, t) for v, t in zip(r.values(), types, strict=True)] for r in table.to_pylist()]


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _finite(value: Any) -> Any:
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


@formatter("json")
def write_json(table: pa.Table, out: TextIO, opts: RenderOptions) -> None:
    """A JSON array with one object per row (lists stay lists, maps become objects, NaN becomes null)."""
    names = table.column_names
    records = [dict(zip(names, _finite(r), strict=True)) for r in rows(table)]
    json.dump(records, out, default=_json_default, ensure_ascii=False)
    out.write("\n")


def _csv_cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_default, ensure_ascii=False)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    return "" if value is None else value


@formatter("csv")
def write_csv(table: pa.Table, out: TextIO, opts: RenderOptions) -> None:
    """RFC 4180 CSV with a header row; nested values are JSON text, NULL is an empty cell."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(table.column_names)
    for r in rows(table):
        w.writerow([_csv_cell(v) for v in r])


def _cell(value: Any, opts: RenderOptions) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, list):
        shown = ", ".join(_cell(v, opts) for v in value[: opts.max_list_items])
        more = f", ... ({len(value)} items)" if len(value) > opts.max_list_items else ""
        text = f"[{shown}{more}]"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {_cell(v, opts)}" for k, v in value.items()) + "}"
    elif isinstance(value, datetime):
        text = value.isoformat(sep=" ")
    else:
        text = str(value)
    text = " ".join(text.split()) if "\n" in text or "\t" in text else text
    return text if len(text) <= opts.max_width else text[: opts.max_width - 1] + "…"


@formatter("table")
def write_table(table: pa.Table, out: TextIO, opts: RenderOptions) -> None:
    """An aligned text table: numbers right-aligned, long cells and lists cut, at most ``max_rows`` rows.

    EXPLAIN results are printed as the plan text itself.
    """
    if table.column_names == ["explain_key", "explain_value"]:
        for value in table.column("explain_value").to_pylist():
            out.write(f"{value}\n")
        return
    shown = table.slice(0, opts.max_rows)
    cells = [[_cell(v, opts) for v in r] for r in rows(shown)]
    names = table.column_names
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    right = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in table.schema.types]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right, strict=True)]
        return "  ".join(parts).rstrip() + "\n"

    out.write(line(names))
    out.write("  ".join("-" * w for w in widths) + "\n")
    for r in cells:
        out.write(line(r))
    footer = f"({table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    if table.num_rows > len(cells):
        footer += f", {len(cells)} shown; use --max-rows or --format csv|json for all"
    out.write(footer + ")\n")


def render(table: pa.Table, fmt: str, out: TextIO, opts: RenderOptions | None = None) -> None:
    """Write ``table`` to ``out`` in format ``fmt``. Raises ValueError naming the known formats."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown output format {fmt!r}; choose one of {sorted(FORMATS)}")
    FORMATS[fmt](table, out, opts or RenderOptions())


def render_text(table: pa.Table, fmt: str, opts: RenderOptions | None = None) -> str:
    """:func:`render` into a string."""
    buf = io.StringIO()
    render(table, fmt, buf, opts)
    return buf.getvalue()


def export_parquet(table: pa.Table, url: str, storage_options: dict[str, Any] | None = None) -> str:
    """Write ``table`` atomically as a zstd Parquet file at ``url`` (local path or fsspec URL); returns its sha256."""
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    folder, name = posixpath.split(str(url).replace("\\", "/"))
    if not name:
        raise ValueError(f"--parquet needs a file name, got {url!r}")
    return Store(folder or ".", storage_options).write_bytes(name, buf.getvalue())
