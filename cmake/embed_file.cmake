# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed_file.cmake
#
# Writes OUT, a C file defining `const unsigned char NAME[]` (16-byte
# aligned) with the bytes of IN and `const unsigned long NAME_len`. Used
# for the fat binary of libstclient's copy kernel (src/CMakeLists.txt).
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR len "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REPEAT "0x..," 16 line)
string(REGEX REPLACE "(${line})" "\\1\n  " bytes "${bytes}")
file(WRITE "${OUT}.tmp"
  "/* Generated from ${IN} by cmake/embed_file.cmake: do not edit. */\n"
  "extern const unsigned char ${NAME}[];\nextern const unsigned long ${NAME}_len;\n"
  "const unsigned char ${NAME}[] __attribute__((aligned(16))) = {\n  ${bytes}\n};\n"
  "const unsigned long ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
