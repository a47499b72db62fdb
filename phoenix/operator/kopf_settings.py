"""kopf's own settings for the Phoenix operator."""

from __future__ import annotations

import kopf

PREFIX = "phoenix.io"
FINALIZER = f"{PREFIX}/finalizer"


def configure(settings: kopf.OperatorSettings) -> None:
    # kopf's bookkeeping in phoenix.io/* annotations; status holds only Phoenix's own fields.
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    # One operator replica (the Deployment uses the Recreate strategy), so no peering objects are needed.
    settings.peering.standalone = True
    # The operator posts its own Events (events.py): one Normal per action, one Warning per cause. kopf's would
    # add one per retry and per handler run.
    settings.posting.enabled = False
