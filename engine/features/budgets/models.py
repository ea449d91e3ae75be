"""The tables of budgets in money: their peewee models (SQLite creates them) and, in
schema.sql beside this file, the DDL MySQL/MariaDB applies (``initdb``);
tests/kernel/core/test_schema.py holds the two equal."""

import os

from peewee import BigAutoField, BigIntegerField, CharField, DecimalField, IntegerField

from ...core.extension import Tables
from ...core.models import BaseModel, Timestamp


class AiBudget(BaseModel):
    """A budget in money (engine/features/budgets/ledger.py): ``amount`` per period for one
    user, one job type or everything, in the units of ai_usage_log.cost."""

    id = CharField(max_length=36, primary_key=True)
    scope = CharField(max_length=16)  # user | jobType | global
    subject = CharField(max_length=64)  # the user id or job type; '' when global
    period = CharField(max_length=8)  # day | month | total
    amount = DecimalField(max_digits=14, decimal_places=6)
    on_exceeded = CharField(max_length=8)  # fail | wait
    created_at = Timestamp()
    updated_at = Timestamp()

    class Meta:
        table_name = 'ai_budget'
        indexes = ((('scope', 'subject', 'period'), True),)


class AiBudgetSpend(BaseModel):
    """A budget's spend and open reservations in one period (``period_key``)."""

    id = BigAutoField()
    budget_id = CharField(max_length=36)
    period_key = CharField(max_length=16)
    spent_micros = BigIntegerField()  # millionths of the cost unit: exact on both databases
    reserved_micros = BigIntegerField()
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_budget_spend'
        indexes = ((('budget_id', 'period_key'), True),)


class AiBudgetReservation(BaseModel):
    """One provider call's reserved maximum cost, until its usage row is written; ``job_id`` and
    ``attempt_no`` tie it to the job's lock (the reaper releases it when that lock is gone)."""

    id = BigAutoField()
    job_id = CharField(max_length=36)
    attempt_no = IntegerField()
    call_no = IntegerField()
    amount_micros = BigIntegerField()  # the call's maximum cost, in millionths
    spend_ids = CharField(max_length=255)  # the ai_budget_spend rows it counts in: "1,7,9"
    created_at = Timestamp()

    class Meta:
        table_name = 'ai_budget_reservation'
        indexes = ((('job_id',), False), (('created_at',), False))


TABLES = Tables(
    (
        AiBudget,
        AiBudgetSpend,
        AiBudgetReservation,
    ),
    os.path.join(os.path.dirname(os.path.abspath(__file__)), 'schema.sql'),
)
