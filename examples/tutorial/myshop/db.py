"""The shop's database: one table of orders. Its fence and outbox tables live in the same database."""

import os

from sqlalchemy import CheckConstraint, Column, Integer, MetaData, String, Table, create_engine

DATABASE_URL = os.environ.get("SHOP_DATABASE_URL", "sqlite:///shop.db")  # PostgreSQL or MySQL in production
engine = create_engine(DATABASE_URL)

metadata = MetaData()
orders = Table(
    "orders", metadata,
    Column("id", Integer, primary_key=True),
    Column("amount", Integer, CheckConstraint("amount > 0"), nullable=False),  # cents
    Column("charge_id", String(64)),  # the provider's id once the order is charged
)
