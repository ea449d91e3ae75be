"""The terminal events (architecture decision 15): the ``ai.job.succeeded``, ``ai.job.failed`` and
``ai.job.cancelled`` outbox events, written with each terminal transition, are claimed in batches
by the housekeeping leader and handed to the extensions' handlers (the hook point
terminal_events of engine/core/extension.py: the webhooks' fan-out) in the transaction that
marks them published. With no handler installed they are marked published all the same, so
that none waits for ever and the purge deletes them in time."""

from ..core.outbox import TERMINAL_CLAIM


class TerminalEvents:
    def __init__(self, outbox, store, instance_id, handlers=(), batch_size=100):
        self.outbox = outbox
        self.store = store
        self.instance_id = instance_id
        self.handlers = handlers
        self.batch_size = batch_size
        self._claims = 0

    def cycle(self):
        """Claim up to ``batch_size`` terminal events, then, in one transaction, hand them to
        every handler and mark them published. A process that dies between the two leaves
        claims that expire (contracts §4.5); the batch is then handled again (a handler adds
        nothing twice: the webhooks' deliveries are unique per event and endpoint). Returns how
        many events were handled."""
        self._claims += 1
        claimer = '%s#f%d' % (self.instance_id, self._claims)
        events = self.outbox.claim_batch(claimer, self.batch_size, TERMINAL_CLAIM)
        if not events:
            return 0

        def work(tx):
            for handle in self.handlers:
                handle(events)
            self.outbox.mark_published_batch([event.id for event in events], claimer)

        self.store.run_in_transaction(work)
        return len(events)

    def drain(self):
        """Cycles until one handles less than a full batch (a full one: there may be more)."""
        while self.cycle() == self.batch_size:
            pass
