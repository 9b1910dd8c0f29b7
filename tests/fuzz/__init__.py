"""The differential fuzzer of graphc (run by tests/test_fuzz.py).

- `program`: a fuzz case as data whose Python source is exactly what gets traced;
- `strategies`: hypothesis strategies drawing well-typed programs from op families;
- `margins`: whether a case's float64 reference is far enough from ties and kinks to judge a
  float32 run;
- `harness`: eager, interpreter, passes and backends against the float64 reference, with
  `.gir` + `.npz` repros of any mismatch.
"""
