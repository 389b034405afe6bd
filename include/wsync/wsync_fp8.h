/* FP8 codecs (part of the public API; included by wsync.h). */
#ifndef WSYNC_FP8_H
#define WSYNC_FP8_H
#endif
