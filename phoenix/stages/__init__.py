"""Example pipeline for medical documents: Router -> Parser -> Grouper.

Each stage is a thin `BaseProcessor` (router.py, parser.py, grouper.py) over plain library modules that know
nothing about Redis: document_loader (fetching within the router's limits: document_files under DOCUMENT_ROOT,
document_http to the addresses network_policy allows; documents, what a fetch gives or fails with), pdf_text,
layout and ocr (page text with table columns kept apart, scans read by Tesseract), categories (page tags),
extraction, result_rows and llm_extraction (findings), biomarker_groups (canonical names and units). samples.py
writes demo lab reports; corpus.py and evaluation.py are the report corpus and `make eval`.
"""
