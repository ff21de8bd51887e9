/* errbuf.h - the one size of an error message.
 *
 * A function that can fail takes `char *err` pointing at ERR_MAX bytes of
 * its caller's and, on failure, writes one line there saying what went
 * wrong (as SQLite keeps the message on its handle). A caller hands its own
 * buffer down to the callee rather than copying the callee's message into it
 * hop by hop, and writes a new message only when it has something to add.
 * Plain C, no includes: the CUDA sources read it too.
 *
 * defines: ERR_MAX
 */
#ifndef TRAINYARD_ERRBUF_H
#define TRAINYARD_ERRBUF_H

#define ERR_MAX 256

#endif
