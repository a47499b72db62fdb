"""kopf's own settings for the Phoenix operator."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

import kopf

from phoenix.kube_names import FINALIZER, LAST_HANDLED_KEY, PREFIX

# kopf's own API requests (patches of its progress annotations, finalizers): seconds until one is given up and
# retried, instead of kopf's 300.
REQUEST_TIMEOUT_SECONDS = 60.0
CONNECT_TIMEOUT_SECONDS = 10.0
# Watches: the API server ends each after this long (kopf then watches again from the last version), and kopf
# gives up on one that has not ended a little later, so a connection that went silent is noticed.
WATCH_SERVER_TIMEOUT_SECONDS = 300
WATCH_CLIENT_TIMEOUT_SECONDS = WATCH_SERVER_TIMEOUT_SECONDS + 30


def configure(settings: kopf.OperatorSettings, children: Iterable[tuple[str, str]], managed: str) -> None:
    """`children`: (group, plural) of the kinds the operator creates, watched only where labelled `managed`."""
    # kopf's bookkeeping in phoenix.io/* annotations; status holds only Phoenix's own fields.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=PREFIX, key=LAST_HANDLED_KEY)
    # One replica acts at a time through the Lease (kube/leader.py); kopf's peering would freeze, not elect.
    settings.peering.standalone = True
    # The operator posts its own Events (kube/events.py): one Normal per action, one Warning per cause. kopf's would
    # add one per retry and per handler run.
    settings.posting.enabled = False
    settings.networking.request_timeout = REQUEST_TIMEOUT_SECONDS
    settings.networking.connect_timeout = CONNECT_TIMEOUT_SECONDS
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.watching.connect_timeout = CONNECT_TIMEOUT_SECONDS
    # Children are watched for drift: ask the API server for the operator's own only (a label selector on the
    # watch), not for every Deployment of the cluster.
    for child in children:
        settings.watching.label_selectors[child] = managed


class QuietHandlers(logging.Filter):
    """Drops kopf's "Handler '<id>' succeeded." lines of the given handlers: the watchers of stages and children
    run on every watch event, so their successes would drown the log."""

    def __init__(self, handler_ids: Iterable[str]) -> None:
        super().__init__()
        ids = "|".join(re.escape(handler_id) for handler_id in handler_ids)
        self._pattern = re.compile(rf"^Handler '({ids})' succeeded\.$")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self._pattern.match(record.getMessage())


def quiet_handlers(handler_ids: Iterable[str]) -> None:
    logging.getLogger("kopf.objects").addFilter(QuietHandlers(handler_ids))
