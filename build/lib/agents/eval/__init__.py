"""The graded task suite: case files, a deterministic grader over a settled task's record, the
runner behind `manage.py acthelm_eval`, and the report (pass rates with Wilson intervals).

See docs/eval.md.
"""
