/* Layout builders (part of the public API; included by wsync.h). */
#ifndef WSYNC_LAYOUT_H
#define WSYNC_LAYOUT_H
#endif
