"""Continuous batching for a server's slots: the rendezvous, the scheduling policy as data, a request's claim and a
slot's state, the slots and their shares of the contexts."""
