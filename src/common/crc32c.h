/* src/common: CRC-32C (Castagnoli), the checksum of the server's journal
 * records (server/journal.c). Bitwise table of 256 entries built on first
 * use; any thread (the table is built once, under pthread_once). */
#ifndef ST_COMMON_CRC32C_H
#define ST_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of (data, len), continued from crc (start with 0). */
uint32_t st__crc32c(uint32_t crc, const void *data, size_t len);

#endif
