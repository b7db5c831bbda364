"""Dataset files: records to and from parquet, and writing a synthetic train/val pair.

Owns the on-disk format (one parquet file per split, one row per record, the columns verl uses)
and its validation: a missing file, an unreadable file, a missing required column or text that
is not UTF-8 raises DatasetError naming the file (and the row and column). Turning records
into token ids is `dagrl.data.prompt_dataset`'s job.

verl's layout is read as it is: its GSM8K/MATH files keep the answer in a struct column
`reward_model` (`{ground_truth, style}`) beside `ability`, `data_source`, `prompt` and
`extra_info`; without a `ground_truth` column, each record's `ground_truth` is taken from
`reward_model.ground_truth` (the other columns travel along unchanged).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dagrl.data.tasks import Record, Task, generate_splits
from dagrl.errors import DatasetError

# The file format's column names (verl's): a record's keys. Some reappear as the batch columns
# of the same names (`dagrl.batch.schema`: GROUND_TRUTH, DATA_SOURCE, EXTRA_INFO), which copy
# them; the files keep verl's names whatever the batch calls its fields, so they are spelled
# out here, not taken from the schema.
REQUIRED_COLUMNS = ("prompt", "ground_truth", "data_source")
VERL_REWARD_COLUMN = "reward_model"  # verl: {"ground_truth": ..., "style": "rule"}
# Used for an empty split, where pyarrow has no rows to infer types from.
_RECORD_SCHEMA = pa.schema(
    [
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ground_truth", pa.string()),
        ("data_source", pa.string()),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ]
)


@dataclass(frozen=True)
class DatasetPaths:
    """Where `make_dataset` wrote each split."""

    train: Path
    val: Path


def write_parquet(records: Sequence[Record], path: str | Path) -> Path:
    """Write `records` (dicts with at least REQUIRED_COLUMNS) as one parquet file; return its path.

    Column types are inferred from the records, so extra columns travel along.
    """
    target = Path(path)
    for row, record in enumerate(records):
        missing = [column for column in REQUIRED_COLUMNS if column not in record]
        if missing:
            raise DatasetError(
                f"record {row} for {target} lacks required column(s) {missing}; every record "
                f"needs {list(REQUIRED_COLUMNS)}"
            )
    table = pa.Table.from_pylist(list(records)) if records else _RECORD_SCHEMA.empty_table()
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)
    return target


def read_parquet(
    path: str | Path, required_columns: Sequence[str] = REQUIRED_COLUMNS
) -> list[Record]:
    """Read a parquet file into records (one dict per row), checking `required_columns`."""
    source = Path(path)
    if not source.is_file():
        raise DatasetError(
            f"dataset file {source} does not exist; check the path, or create it with "
            "dagrl.data.make_dataset"
        )
    try:
        table = pq.read_table(source)
    except (pa.ArrowException, OSError) as error:
        raise DatasetError(
            f"dataset file {source} is not a readable parquet file: {error}"
        ) from error
    records = _records(table, source)
    columns = table.column_names
    if "ground_truth" not in columns and VERL_REWARD_COLUMN in columns:
        records = [_with_verl_ground_truth(r, i, source) for i, r in enumerate(records)]
        columns = [*columns, "ground_truth"]
    missing = [column for column in required_columns if column not in columns]
    if missing:
        raise DatasetError(
            f"dataset file {source} lacks required column(s) {missing}; it has columns "
            f"{table.column_names}. Add the column(s) when writing the file (verl's layout, "
            f"the answer in `{VERL_REWARD_COLUMN}.ground_truth`, is read as well)."
        )
    return records


def _records(table: pa.Table, source: Path) -> list[Record]:
    """The table's rows as dicts. Text that is not UTF-8 (pyarrow does not check it when it
    reads a file) is a DatasetError naming the row and the column, not a bare
    UnicodeDecodeError from inside pyarrow."""
    try:
        return table.to_pylist()
    except UnicodeDecodeError as error:
        raise DatasetError(_where_not_utf8(table, source) + f" ({error.reason}); write the "
                           "file's text as UTF-8") from error


def _where_not_utf8(table: pa.Table, source: Path) -> str:
    """Which row and column hold the text that does not decode (the slow search runs only
    once a decode has failed)."""
    for name in table.column_names:
        column = table.column(name)
        try:
            column.to_pylist()
            continue
        except UnicodeDecodeError:
            pass
        for row in range(len(column)):
            try:
                column[row].as_py()
            except UnicodeDecodeError:
                return f"row {row} of {source}, column {name!r}: its text is not valid UTF-8"
    return f"dataset file {source}: some text is not valid UTF-8"


def _with_verl_ground_truth(record: Record, row: int, source: Path) -> Record:
    """`record` with `ground_truth` from verl's `reward_model.ground_truth`."""
    reward = record[VERL_REWARD_COLUMN]
    if not isinstance(reward, dict) or reward.get("ground_truth") is None:
        raise DatasetError(
            f"row {row} of {source}: {VERL_REWARD_COLUMN} is {reward!r}; in verl's layout it "
            "must hold the answer as {'ground_truth': ..., 'style': 'rule'} (or give the file "
            "a `ground_truth` column)"
        )
    return {**record, "ground_truth": reward["ground_truth"]}


def make_dataset(
    task: str | Task, n_train: int, n_val: int, out_dir: str | Path, seed: int
) -> DatasetPaths:
    """Generate a synthetic task's splits and write out_dir/train.parquet and out_dir/val.parquet.

    The same arguments write the same rows; no val prompt appears in train.
    """
    train, val = generate_splits(task, n_train, n_val, seed)
    directory = Path(out_dir)
    return DatasetPaths(
        train=write_parquet(train, directory / "train.parquet"),
        val=write_parquet(val, directory / "val.parquet"),
    )
