"""The mechanisms of lessons 04-08, built on the core.

* :mod:`labkit.mechanisms.issuers` (lesson 04): who issues the numbers; epochs.
* :mod:`labkit.mechanisms.timing` (lessons 05-06): deadlines, backoff, version waits.
* :mod:`labkit.mechanisms.recovery` (lesson 07): durable claims, progress and sweepers.
* :mod:`labkit.mechanisms.effects` (lesson 08): fenced files, emails, outbox, payments.
"""
