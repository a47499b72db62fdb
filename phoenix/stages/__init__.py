"""Example pipeline for medical documents: Router -> Parser -> Grouper.

Each stage is a thin `BaseProcessor` (router.py, parser.py, grouper.py) over plain library modules that know
nothing about Redis: documents (fetching), pdf_text (page text), categories (page tags), extraction and
llm_extraction (findings), biomarker_groups (canonical names and units). samples.py writes demo lab reports.
"""
