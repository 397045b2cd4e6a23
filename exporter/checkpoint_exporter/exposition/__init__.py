"""Exposition: a snapshot to bytes (collectors, renderer, HTTP server, landing
page, runbooks page).
"""
