"""Redis key names shared by the stages, so a reader of one stage's output knows where to look.

Each is scoped by the worker's KEY_NAMESPACE (`phoenix.keys.shared_data_key`: `phoenix:{<namespace>}:_pages:<id>`),
so two copies of the pipeline on one Redis, even with the same record ids, never read each other's documents,
and the data a stage hands over stays in the pipeline's hash tag.

A key one stage writes for the next (pages, parsed) has no expiry of its own: it lives as long as the record is
unfinished, so no stage outage, however long, can make a record unrecoverable. The stage that consumes it
deletes it (pages) or gives it its lifetime then (parsed expires with grouped, GROUPED_TTL after grouping). Pages
of a record dead-lettered on its way to the parser stay with its DLQ entry, for a replay, and go when the entry is
purged (`held_pages`, `phoenix dlq purge`).
"""

import json
from collections.abc import Mapping

from phoenix.keys import shared_data_key


def pages_key(namespace: str, record_id: str) -> str:
    """Router -> Parser: the document's pages with their text and categories."""
    return shared_data_key(namespace, "pages", record_id)


def parsed_key(namespace: str, record_id: str) -> str:
    """Parser -> Grouper (and readers): the findings extracted from the document."""
    return shared_data_key(namespace, "parsed", record_id)


def grouped_key(namespace: str, record_id: str) -> str:
    """Grouper -> readers: biomarkers grouped under canonical names."""
    return shared_data_key(namespace, "grouped", record_id)


def held_pages(namespace: str, fields: Mapping[str, str]) -> str | None:
    """The pages key an entry of the parser's input holds (the router forwards it as `pages_key`), if it is a
    pages key of `namespace`: the parser reads no other key, and a purge deletes no other."""
    try:
        data = json.loads(fields.get("data") or "{}")
    except ValueError:
        data = {}
    key = (data.get("pages_key") if isinstance(data, dict) else None) or fields.get("pages_key")
    return key if isinstance(key, str) and is_pages_key(namespace, key) else None


def is_pages_key(namespace: str, key: str) -> bool:
    """Whether `key` (as a message names it) is a pages key of `namespace`: no other tenant's, no other key."""
    return key.startswith(pages_key(namespace, ""))
