"""Asynchronous training in one package: which ranks generate and which train (sides), how far
generation may run ahead of training (staleness), the policy-version ledger, publishing and
receiving weights between the sides, and the pipelined training loop that drives them."""
