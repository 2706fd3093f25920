#!/usr/bin/perl
# cuda_emu_translate.pl IN.cu OUT.cpp: rewrites every kernel launch
# `kernel<<<config>>>(args);` of a .cu file (a template's too:
# `kernel<float><<<...`) into a call g++ can compile,
# `emu_launch([=] { kernel(args); }, "kernel (IN.cu:LINE)", config);`,
# keeping every line where it was (cuda_emu.h says what emu_launch does).
# The arguments are captured by value: a launch may be queued and run
# after the caller returned (PPRUN_STUB_ASYNC_US).
use strict;
use warnings;
my ($in, $out) = @ARGV;
die "usage: cuda_emu_translate.pl IN.cu OUT.cpp\n" unless defined $out;
open(my $fh, '<', $in) or die "cuda_emu_translate.pl: cannot read $in: $!\n";
local $/;
my $src = <$fh>;
close $fh;
my $launches = 0;
$src =~ s{(\w+)((?:<[\w\s,]*>)?)<<<(.*?)>>>\((.*?)\);}{
    my $line = 1 + (substr($src, 0, $-[0]) =~ tr/\n//);
    $launches++;
    "emu_launch([=] { $1$2($4); }, \"$1 ($in:$line)\", $3);"
}gse;
die "cuda_emu_translate.pl: no kernel launch found in $in\n" unless $launches;
open(my $oh, '>', $out) or die "cuda_emu_translate.pl: cannot write $out: $!\n";
print $oh "#line 1 \"$in\"\n", $src;
close $oh or die "cuda_emu_translate.pl: cannot write $out: $!\n";
