"""Freeing windows when no event loop runs: scripts, the self-test, the monkey, tests.

``deleteLater()`` posts a deferred delete, which Qt delivers only from an event loop that
started before it was posted, or when asked for by type; ``processEvents()`` outside any
loop never delivers it. A window closed and ``deleteLater``-ed in a script that runs no
loop therefore lives on, with all its widgets, until the process ends. :func:`delete_now`
asks for the deferred deletes explicitly.
"""

from __future__ import annotations

from PySide6.QtCore import QCoreApplication, QEvent, QObject


def delete_now(*objects: QObject) -> None:
    """``deleteLater()`` each of ``objects``, then deliver every pending deferred delete
    (theirs and any other object's) and the events the deletions posted.

    A window must be closed first: its close stops its background work, and a job still
    running would report to a deleted window.
    """
    for obj in objects:
        obj.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QCoreApplication.processEvents()
