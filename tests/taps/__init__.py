"""Tests of billing.taps: SSE decoding and the per-protocol stream taps."""
