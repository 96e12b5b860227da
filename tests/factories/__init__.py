"""Builders the tests share: real digits as curated tables, fast training settings, a trained champion."""
