"""Links whose path names a file type the spider does not take: Scrapy's ignored extensions.

A link to ``report.pdf`` or ``photo.JPG`` from a spider that parses HTML is downloaded and
then skipped (``Spider.content_types``), at the cost of a whole interval on a polite site.
Scrapy's link extractor skips such links (``scrapy.linkextractors.IGNORED_EXTENSIONS``);
here every request a callback yields is checked against ``Spider.deny_extensions`` less
the extensions of the types the spider accepts (``application/pdf`` keeps ``.pdf`` links).
"""

from __future__ import annotations

import functools

#: The type a server sends for each extension Scrapy ignores (``Spider.deny_extensions``),
#: so that a spider accepting that type (or its family, ``image/*``) follows such links.
EXTENSION_TYPES: dict[str, str] = {
    # archives
    **dict.fromkeys(("7z", "7zip"), "application/x-7z-compressed"),
    "bz2": "application/x-bzip2",
    "rar": "application/vnd.rar",
    "tar": "application/x-tar",
    "tar.gz": "application/gzip",
    "xz": "application/x-xz",
    "zip": "application/zip",
    # images
    "mng": "video/x-mng",
    "pct": "image/x-pict",
    "bmp": "image/bmp",
    "gif": "image/gif",
    **dict.fromkeys(("jpg", "jpeg"), "image/jpeg"),
    "png": "image/png",
    "pst": "application/vnd.ms-outlook",
    "psp": "image/x-paintshoppro",
    **dict.fromkeys(("tif", "tiff"), "image/tiff"),
    **dict.fromkeys(("ai", "eps", "ps"), "application/postscript"),
    "drw": "image/x-drw",
    "dxf": "image/vnd.dxf",
    "svg": "image/svg+xml",
    "cdr": "image/x-coreldraw",
    "ico": "image/vnd.microsoft.icon",
    "webp": "image/webp",
    # audio
    "mp3": "audio/mpeg",
    "wma": "audio/x-ms-wma",
    "ogg": "audio/ogg",
    "wav": "audio/wav",
    "ra": "audio/x-pn-realaudio",
    "aac": "audio/aac",
    "mid": "audio/midi",
    "au": "audio/basic",
    "aiff": "audio/aiff",
    "m4a": "audio/mp4",
    # video
    "3gp": "video/3gpp",
    **dict.fromkeys(("asf", "asx"), "video/x-ms-asf"),
    "avi": "video/x-msvideo",
    **dict.fromkeys(("mov", "qt"), "video/quicktime"),
    "mp4": "video/mp4",
    "mpg": "video/mpeg",
    "rm": "application/vnd.rn-realmedia",
    "swf": "application/x-shockwave-flash",
    "wmv": "video/x-ms-wmv",
    "m4v": "video/x-m4v",
    "flv": "video/x-flv",
    "webm": "video/webm",
    # office suites
    "xls": "application/vnd.ms-excel",
    "xlsm": "application/vnd.ms-excel.sheet.macroenabled.12",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "xltm": "application/vnd.ms-excel.template.macroenabled.12",
    "xltx": "application/vnd.openxmlformats-officedocument.spreadsheetml.template",
    "potm": "application/vnd.ms-powerpoint.template.macroenabled.12",
    "potx": "application/vnd.openxmlformats-officedocument.presentationml.template",
    **dict.fromkeys(("ppt", "pps"), "application/vnd.ms-powerpoint"),
    "pptm": "application/vnd.ms-powerpoint.presentation.macroenabled.12",
    "pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    **dict.fromkeys(("doc", "docb"), "application/msword"),
    "docm": "application/vnd.ms-word.document.macroenabled.12",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "dotm": "application/vnd.ms-word.template.macroenabled.12",
    "dotx": "application/vnd.openxmlformats-officedocument.wordprocessingml.template",
    "odt": "application/vnd.oasis.opendocument.text",
    "ods": "application/vnd.oasis.opendocument.spreadsheet",
    "odg": "application/vnd.oasis.opendocument.graphics",
    "odp": "application/vnd.oasis.opendocument.presentation",
    # other
    "css": "text/css",
    "pdf": "application/pdf",
    **dict.fromkeys(("exe", "bin", "bat", "cpl", "msp"), "application/octet-stream"),
    "rss": "application/rss+xml",
    "dmg": "application/x-apple-diskimage",
    "iso": "application/x-iso9660-image",
    "apk": "application/vnd.android.package-archive",
    "jar": "application/java-archive",
    "sh": "application/x-sh",
    "rb": "text/x-ruby",
    "js": "text/javascript",
    "hta": "application/hta",
    "msi": "application/x-msi",
    "py": "text/x-python",
}

#: Scrapy's ``IGNORED_EXTENSIONS`` (scrapy/linkextractors/__init__.py): the default of ``Spider.deny_extensions``.
IGNORED_EXTENSIONS: frozenset[str] = frozenset(EXTENSION_TYPES)

#: The type of an extension not in EXTENSION_TYPES: what servers send for a file they cannot name.
UNKNOWN_TYPE = "application/octet-stream"


def extension_type(extension: str) -> str:
    """The content type a server sends for a file of ``extension`` (``pdf``, ``.PDF``: ``application/pdf``)."""
    return EXTENSION_TYPES.get(normal_extension(extension), UNKNOWN_TYPE)


def normal_extension(extension: str) -> str:
    """``extension`` as ``deny_extensions`` holds it: lower case, without a leading dot (``.JPG``: ``jpg``)."""
    return extension.lower().lstrip(".")


def link_extension(url: str, denied: frozenset[str]) -> str | None:
    """The extension of ``denied`` that ``url``'s path ends in (case aside), or None.

    Only the path counts, as Scrapy's ``url_has_any_extension`` reads it: not the host
    (``https://example.zip``), the query (``a.pdf?x=1`` is a PDF), the fragment or the
    last segment's ``;parameters``; a path ending in ``/`` names no file. An extension
    of several parts (``tar.gz``) is matched whole.
    """
    if not denied:
        return None
    if "#" in url:
        url = url.partition("#")[0]
    if "?" in url:
        url = url.partition("?")[0]
    before, _, segment = url.rpartition("/")
    if before[-2:] == ":/" and "/" not in before[:-2]:
        return None  # "scheme://host": no path, and a dot there is the host's
    if ";" in segment:
        segment = segment.partition(";")[0]
    name, dot, extension = segment.rpartition(".")
    if not dot:
        return None
    extension = extension.lower()
    if extension in denied:
        return extension
    if "." not in name or extension not in _last_parts(denied):
        return None
    while "." in name:  # "tar.gz" of "x.tar.gz"
        name, _, part = name.rpartition(".")
        extension = f"{part.lower()}.{extension}"
        if extension in denied:
            return extension
    return None


@functools.lru_cache(maxsize=64)
def _last_parts(denied: frozenset[str]) -> frozenset[str]:
    """The last parts of ``denied``'s extensions of several parts (``gz`` of ``tar.gz``)."""
    return frozenset(extension.rpartition(".")[2] for extension in denied if "." in extension)
