"""pytest plugin (`-p folio_patch`) for llama.cpp's server tests, run offline on one model.

scripts/llama_suite.sh copies llama.cpp's tools/server/tests under target/ and runs it
with this plugin; the vendored sources are not touched. It patches utils.py's
ServerProcess/ServerPreset:
- every model the suite would fetch from Hugging Face (--hf-repo, --hf-file,
  --model-url) is the local GGUF $FOLIO_SUITE_MODEL instead, for both servers alike,
  and ServerPreset.load_all (the download of every preset) does nothing;
- paths the suite gives relative to its own directory (`../../../models/templates/…`,
  the media path) are made absolute against the vendored llama.cpp ($LLAMA_SUITE_SRC),
  since the copy lives elsewhere;
- a response's headers stay case-insensitive (utils.py copies them into a plain dict,
  so `"Access-Control-Allow-Origin" in res.headers` failed on a server that sends
  header names in lower case, as HTTP allows and hyper does).
"""
import os

import requests

import utils

MODEL = os.environ["FOLIO_SUITE_MODEL"]
SRC_TESTS = os.environ["LLAMA_SUITE_SRC"]  # the vendored tools/server/tests

_start = utils.ServerProcess.start


def _absolute(path):
    if path and not os.path.isabs(path) and "://" not in path:
        return os.path.normpath(os.path.join(SRC_TESTS, path))
    return path


def start(self, *args, **kwargs):
    if self.model_hf_repo or self.model_hf_file or self.model_url:
        self.model_hf_repo = None
        self.model_hf_file = None
        self.model_url = None
        self.model_file = MODEL
    self.mmproj_url = None  # no projector for our model; vision tests are not run
    self.offline = True
    self.chat_template_file = _absolute(self.chat_template_file)
    self.media_path = _absolute(self.media_path)
    return _start(self, *args, **kwargs)


_make_request = utils.ServerProcess.make_request


def make_request(self, *args, **kwargs):
    result = _make_request(self, *args, **kwargs)
    result.headers = requests.structures.CaseInsensitiveDict(result.headers)
    return result


utils.ServerProcess.start = start
utils.ServerProcess.make_request = make_request
utils.ServerPreset.load_all = staticmethod(lambda: None)
