"""What a person reads: the live table, results.json, report.md and the charts.

The claim, the evidence and the environment sit together: every number in the table is in results.json
with the recipe that produced it and the machine it was measured on.

  machine.py          the machine a result was measured on (environment), the git commit
  format.py           numbers, speed-ups, verdicts and rung labels as text
  table.py            the ablation table (Columns, headers, table_rows, markdown_table)
  summary.py          the recommendation and how repeatable the verdicts are (best_line, repeatability_line)
  live.py             the terminal while a ladder runs (Display)
  results_json.py     results.json (results_dict)
  notes.py            report.md's Notes: why a rung was not run or failed, what qualifies its numbers
  doctor_findings.py  report.md's Doctor section, read from the folder's doctor.json
  charts.py           the PNG charts
  markdown.py         report.md, and write_report: the whole report folder

No module here is named after a function the package exports, so `trainfast.report.X` always names one
thing.
"""
from .charts import write_charts
from .doctor_findings import doctor_section, replace_doctor_section, saves_text
from .format import fmt_bytes, fmt_flops, fmt_rate, fmt_sig, fmt_speedup, rung_label, short_verdict
from .live import Display
from .machine import environment
from .markdown import metric_note, data_wait_line, how_to_read, write_report
from .notes import above_ceiling_note, rung_notes
from .results_json import results_dict, write_results_json
from .summary import best_line, joint_agreement, repeatability_line
from .table import Columns, headers, markdown_table, table_rows

__all__ = ["Display", "environment", "write_report", "results_dict", "write_results_json", "write_charts",
           "Columns", "headers", "table_rows", "markdown_table", "rung_label", "fmt_rate", "fmt_sig", "fmt_bytes",
           "fmt_flops", "fmt_speedup", "short_verdict", "best_line", "repeatability_line", "joint_agreement",
           "metric_note", "data_wait_line", "above_ceiling_note", "how_to_read", "rung_notes", "doctor_section",
           "replace_doctor_section", "saves_text"]
